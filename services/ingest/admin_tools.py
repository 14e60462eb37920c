"""Admin tool handlers served by ingest on behalf of maintenance (memory_consolidate).

Ingest never runs the cycle itself (it must not import the worker's code): it records a
maintenance_runs row, sends "maintenance.consolidate" with the run id after that row is
committed, and waits a bounded time for the worker to finish it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import anyio
from fastapi import Request
from kombu.exceptions import KombuError
from redis.exceptions import RedisError

from services.common.internal import ToolContext, parse_arguments
from shared.contract.maintenance import CONSOLIDATION_STAGES, MemoryConsolidateArgs
from shared.domain.errors import InvalidParams
from shared.jobs import QUEUE_MAINTENANCE
from shared.repositories import maintenance as runs_repo
from shared.repositories.maintenance import Tenant
from shared.telemetry import inject_headers

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
    celery = request.app.state.celery
    if celery is None:
        return {"success": False, "error": "memory_consolidate needs Redis: the cycle runs in the maintenance "
                "worker, and REDIS_ENABLED is false or REDIS_URL is unset"}, True
    pool = request.app.state.resources.pool
    tenant = Tenant.of(ctx.principal)
    async with pool.acquire() as conn:
        run_id = await runs_repo.create_run(conn, "consolidate", tenant, {"stages": args.stages, "trigger": "memory_consolidate"})

    def send() -> None:
        celery.send_task(
            CONSOLIDATE_TASK, kwargs={"run_id": run_id, "tenant": tenant.label, "stages": args.stages},
            queue=QUEUE_MAINTENANCE, headers=inject_headers({}), retry=False,
        )

    try:
        await anyio.to_thread.run_sync(send)
    except (KombuError, RedisError, OSError) as exc:
        logger.warning("could not enqueue %s", CONSOLIDATE_TASK, exc_info=True)
        async with pool.acquire() as conn:
            await runs_repo.finish_run(conn, run_id, "failed", {}, f"broker unavailable: {exc.__class__.__name__}")
        return {"success": False, "runId": run_id, "error": "Redis is unreachable; the consolidation was not queued"}, True

    if not args.wait:
        return {"queued": True, "runId": run_id}, False
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
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
