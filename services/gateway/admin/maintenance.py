"""Admin REST routes about maintenance; master key only.

Consolidation status and runs, the anomalies of the last cycle, and fsck (mnemory's memory
check): start a check in the background, poll its progress and issues, apply selected
fixes. Work runs in the maintenance worker; a job is sent only after its run row exists.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Request
from pydantic import Field

from services.gateway.admin.admin_auth import require_master
from services.gateway.core.state import gateway_state
from shared.contract.base import Int64, ToolArgs
from shared.domain.fragment import MAX_INT64
from shared.jobs import QUEUE_MAINTENANCE, send_job
from shared.repositories import fsck as fsck_repo
from shared.repositories import maintenance as runs_repo
from shared.repositories.maintenance import Tenant
from shared.settings import MaintenanceSettings

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

FSCK_JOBS = ("fsck", "auto_fsck")
# maintenance_runs.id is a bigserial: a larger id is a 422, not a 500.
RunId = Annotated[int, Path(ge=1, le=MAX_INT64)]


class FsckStart(ToolArgs):  # no NUL / NaN anywhere, strings bounded: a 422, not a 500 from SQL

    # Whose memories: every tenant (default), the master key's own, or one key.
    keyId: str | None = None
    scope: Literal["all", "master", "key"] = "all"
    # mnemory: a manual check scans everything; auto-fsck is incremental.
    incremental: bool = False


class FsckApply(ToolArgs):

    issueIds: list[Int64] | None = Field(None, description="Issues to apply; omitted = every open issue of the run")


def _tenant(body: FsckStart) -> Tenant:
    if body.keyId is not None or body.scope == "key":
        if not body.keyId:
            raise HTTPException(status_code=400, detail="keyId is required with scope=key")
        return Tenant(all=False, key_id=body.keyId)
    return Tenant() if body.scope == "all" else Tenant(all=False, key_id=None)


async def _send(request: Request, task: str, kwargs: dict[str, Any]) -> None:
    celery = gateway_state(request).celery
    if celery is None:
        raise HTTPException(status_code=503, detail="Redis is not configured: maintenance jobs run in the Celery worker")

    # send_task does blocking broker I/O; keep it off the event loop.
    if not await anyio.to_thread.run_sync(lambda: send_job(celery, task, kwargs, queue=QUEUE_MAINTENANCE)):
        raise HTTPException(status_code=503, detail="could not reach the broker; try again")


@router.get("/maintenance/consolidation")
async def consolidation_status(request: Request) -> dict[str, Any]:
    settings = MaintenanceSettings()
    async with gateway_state(request).pool.acquire() as conn:
        status = await runs_repo.consolidation_status(conn, enabled=settings.consolidate_enabled, interval=settings.consolidate_interval)
        latest = await runs_repo.recent_runs(conn, "consolidate", 1)
    if latest:
        result = runs_repo.run_to_wire(latest[0])["result"] or {}
        # Per-stage numbers of the latest run: what it changed and how long it took.
        status["lastRunStages"] = {
            name: {k: v for k, v in stage.items() if k in ("processed", "durationMs", "limit", "error", "skipped")}
            for name, stage in (result.get("stages") or {}).items()
        }
    status["disabledStages"] = sorted(settings.disabled_stages)
    return status


@router.get("/maintenance/runs")
async def list_runs(request: Request, job: str | None = None, limit: int = 20) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        rows = await runs_repo.recent_runs(conn, job, max(1, min(limit, 200)))
    return {"runs": [runs_repo.run_to_wire(r) for r in rows]}


@router.get("/maintenance/runs/{run_id}")
async def get_run(request: Request, run_id: RunId) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        row = await runs_repo.get_run(conn, run_id)
    if row is None:
        raise HTTPException(status_code=404, detail="run not found")
    return runs_repo.run_to_wire(row)


@router.get("/memory/anomalies")
async def anomalies(request: Request) -> dict[str, Any]:
    """seed: anomaly detection results -- those of the latest cycle that scanned for them."""
    async with gateway_state(request).pool.acquire() as conn:
        row = await runs_repo.latest_anomaly_scan(conn)
    if row is None:
        return {"anomalies": [], "runId": None, "checkedAt": None}
    result = json.loads(row["result"]) if isinstance(row["result"], str) else row["result"]
    return {
        "anomalies": result["stages"]["anomalies"]["anomalies"],
        "runId": row["id"],
        "tenant": row["tenant"],
        "checkedAt": row["finished_at"].isoformat() if row["finished_at"] else None,
    }


@router.post("/fsck", status_code=202)
async def start_fsck(request: Request, body: FsckStart | None = None) -> dict[str, Any]:
    body = body or FsckStart()
    tenant = _tenant(body)
    async with gateway_state(request).pool.acquire() as conn:
        run_id = await runs_repo.create_run(conn, "fsck", tenant, {"incremental": body.incremental, "trigger": "admin"})
    await _send(request, "maintenance.fsck", {"run_id": run_id, "tenant": tenant.label, "incremental": body.incremental})
    return {"id": run_id, "status": "queued", "tenant": tenant.label}


@router.post("/fsck/auto-run", status_code=202)
async def start_auto_fsck(request: Request, body: FsckStart | None = None) -> dict[str, Any]:
    body = body or FsckStart()
    tenant = _tenant(body)
    async with gateway_state(request).pool.acquire() as conn:
        run_id = await runs_repo.create_run(conn, "auto_fsck", tenant, {"incremental": True, "trigger": "admin"})
    await _send(request, "maintenance.auto_fsck", {"run_id": run_id, "tenant": tenant.label})
    return {"id": run_id, "status": "queued", "tenant": tenant.label}


@router.get("/fsck/{run_id}")
async def fsck_status(request: Request, run_id: RunId) -> dict[str, Any]:
    async with gateway_state(request).pool.acquire() as conn:
        row = await runs_repo.get_run(conn, run_id)
        if row is None or row["job"] not in FSCK_JOBS:
            raise HTTPException(status_code=404, detail="fsck run not found")
        issues = await fsck_repo.issues_of_run(conn, run_id)
    return {**runs_repo.run_to_wire(row), "issues": issues}


@router.post("/fsck/{run_id}/apply")
async def apply_fixes(request: Request, run_id: RunId, body: FsckApply | None = None) -> dict[str, Any]:
    body = body or FsckApply()
    async with gateway_state(request).pool.acquire() as conn:
        row = await runs_repo.get_run(conn, run_id)
        if row is None or row["job"] not in FSCK_JOBS:
            raise HTTPException(status_code=404, detail="fsck run not found")
        if row["status"] != "succeeded":
            raise HTTPException(status_code=409, detail=f"fsck run is {row['status']}; fixes apply to a completed check")
        async with conn.transaction():
            outcome = await fsck_repo.apply_issues(conn, run_id, body.issueIds)
    return {"runId": run_id, **outcome}


@router.post("/sessions/reflect-all", status_code=202)
async def reflect_all(request: Request) -> dict[str, Any]:
    """seed: reflect every unreflected ended session (the worker's sweep, now)."""
    async with gateway_state(request).pool.acquire() as conn:
        pending = await runs_repo.unreflected_sessions(conn, 10_000)
    await _send(request, "maintenance.reflect_sweep", {})
    return {"queued": True, "pending": len(pending)}


@router.post("/sessions/{session_id}/reflect", status_code=202)
async def reflect_session(request: Request, session_id: str) -> dict[str, Any]:
    """seed: run reflect for one session now (AutoReflect, as its own key)."""
    async with gateway_state(request).pool.acquire() as conn:
        session = await runs_repo.session_row(conn, session_id)
    if session is None:
        raise HTTPException(status_code=404, detail="session not found")
    await _send(request, "maintenance.auto_reflect", {"session_id": session_id, "key_id": session["key_id"], "reason": "manual"})
    return {"queued": True, "sessionId": session_id, "alreadyReflected": session["reflected_at"] is not None}
