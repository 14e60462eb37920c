"""Admin tool handlers served by ingest on behalf of maintenance (memory_consolidate).

Ingest never runs the cycle itself (it must not import the worker's code): it records a
maintenance_runs row and the "maintenance.consolidate" job (the job outbox, shared/jobs.py)
in one transaction, and waits a bounded time for the worker to finish it. While the broker
is down the run stays queued and starts when the broker is back; the reply says queued.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import Request

from services.common.internal import ToolContext, parse_arguments
from shared.contract.maintenance import CONSOLIDATION_STAGES, MemoryConsolidateArgs
from shared.domain.errors import InvalidParams
from shared.jobs import QUEUE_MAINTENANCE
from shared.repositories import maintenance as runs_repo
from shared.repositories.maintenance import Tenant

logger = logging.getLogger(__name__)

CONSOLIDATE_TASK = "maintenance.consolidate"
# Below the gateway's 30 s upstream timeout (UPSTREAM_TIMEOUT), so a long cycle answers
# {queued, runId} instead of a gateway timeout; the steady-state cycle finishes well within.
WAIT_SECONDS = 25.0
POLL_SECONDS = 0.25


async def memory_consolidate(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: MemoryConsolidateArgs = parse_arguments(MemoryConsolidateArgs, arguments)
    unknown = sorted(set(args.stages or ()) - set(CONSOLIDATION_STAGES))
    if unknown:
        raise InvalidParams(f"Invalid params: stages: unknown {unknown}; one of {list(CONSOLIDATION_STAGES)}")
    # Without a broker (app.state.celery) there is no relay and no worker to run the cycle.
    relay = request.app.state.resources.relay if request.app.state.celery is not None else None
    if relay is None:
        return {"success": False, "error": "memory_consolidate needs Redis: the cycle runs in the maintenance "
                "worker, and REDIS_ENABLED is false or REDIS_URL is unset"}, True
    res = request.app.state.resources
    pool = res.pool
    tenant = Tenant.of(ctx.principal)
    jobs = res.job_buffer()
    async with pool.acquire() as conn, conn.transaction():
        run_id = await runs_repo.create_run(conn, "consolidate", tenant, {"stages": args.stages, "trigger": "memory_consolidate"})
        await jobs.record(conn, CONSOLIDATE_TASK, queue=QUEUE_MAINTENANCE, run_id=run_id, tenant=tenant.label, stages=args.stages)
    relay.wake()

    if not args.wait:
        return {"queued": True, "runId": run_id}, False
    deadline = time.monotonic() + WAIT_SECONDS
    # While the broker refuses the job nothing can finish it: answer queued at once.
    while time.monotonic() < deadline and not relay.broker_down:
        await asyncio.sleep(POLL_SECONDS)
        async with pool.acquire() as conn:
            row = await runs_repo.get_run(conn, run_id)
        if row is not None and row["status"] not in ("queued", "running"):
            result = row["result"]
            report = json.loads(result) if isinstance(result, str) else result
            body = {"success": row["status"] == "succeeded", "runId": run_id, "status": row["status"], **report}
            if row["error"]:
                body["error"] = row["error"]
            return body, row["status"] == "failed"
    return {"queued": True, "runId": run_id}, False


TOOL_HANDLERS: dict[str, Any] = {"memory_consolidate": memory_consolidate}
