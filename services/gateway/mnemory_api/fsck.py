"""/api/fsck: reference 004's memory check on Engram's fsck (the admin API's machinery: a
maintenance_runs row, the worker's phases, fsck_issues, apply_issues), for the caller's own
memories only. Checks and issues are read back in reference 004's shapes."""

from __future__ import annotations

import json
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Path, Request
from pydantic import Field

from services.gateway.core.state import gateway_state
from services.gateway.mnemory_api import upstream
from services.gateway.mnemory_api.auth import MnemoryCaller, reader, writer
from shared.contract.base import ToolArgs
from shared.contract.mnemory import MAX_BY_IDS
from shared.domain.fragment import MAX_INT64
from shared.jobs import QUEUE_MAINTENANCE, send_job
from shared.repositories import fsck as fsck_repo
from shared.repositories import maintenance as runs_repo
from shared.repositories.maintenance import Tenant

router = APIRouter(prefix="/api/fsck", tags=["fsck"])
Writer = Annotated[MnemoryCaller, Depends(writer)]
Reader = Annotated[MnemoryCaller, Depends(reader)]
CheckId = Annotated[int, Path(ge=1, le=MAX_INT64)]
FSCK_JOBS = ("fsck", "auto_fsck")
ISSUE_TYPES = ("duplicate", "quality", "split", "contradiction", "reclassify", "security")
# Engram's phases as reference 004 names them.
PHASES = {"security": "security_scan", "duplicates": "duplicate_search", "contradictions": "duplicate_eval",
          "quality": "quality_check", "metadata": "quality_check", "done": "done"}
STATUS = {"queued": "running", "running": "running", "succeeded": "completed", "failed": "failed", "skipped": "completed"}


class FsckRequest(ToolArgs):
    agent_id: str | None = Field(None, max_length=200, description="Optional: scope check to specific agent")
    categories: list[str] | None = Field(None, max_length=20, description="Optional: scope check to specific categories")
    memory_type: str | None = Field(None, max_length=32, description="Optional: scope check to specific memory type")
    include_raw: bool = Field(False, description="Whether to include raw provisional memories in the check")
    incremental: bool = Field(False, description="When true, only check memories changed since last maintenance")


class FsckApplyRequest(ToolArgs):
    issue_ids: list[str] | None = Field(None, max_length=1000, description="IDs of issues to apply. Null or empty = apply all.")


async def _send(request: Request, task: str, kwargs: dict[str, Any]) -> None:
    celery = gateway_state(request).celery
    if celery is None:
        raise HTTPException(status_code=503, detail="The memory check runs in the maintenance worker, which needs Redis")
    if not await anyio.to_thread.run_sync(lambda: send_job(celery, task, kwargs, queue=QUEUE_MAINTENANCE)):
        raise HTTPException(status_code=503, detail="could not reach the broker; try again")


async def _start(request: Request, who: MnemoryCaller, job: str, params: dict[str, Any]) -> dict[str, Any]:
    tenant = Tenant(all=False, key_id=who.principal.key_id)
    async with gateway_state(request).pool.acquire() as conn:
        run_id = await runs_repo.create_run(conn, job, tenant, {**params, "trigger": "api"})
    task_kwargs: dict[str, Any] = {"run_id": run_id, "tenant": tenant.label}
    if job == "fsck":
        task_kwargs["incremental"] = params.get("incremental", False)
    await _send(request, f"maintenance.{job}", task_kwargs)
    return {"check_id": str(run_id), "status": "running"}


@router.post("")
async def start_fsck(request: Request, who: Writer, req: FsckRequest | None = None) -> dict[str, Any]:
    """Start a memory check (runs in the background)."""
    req = req or FsckRequest()
    if req.agent_id and who.agent_id and req.agent_id != who.agent_id and not req.agent_id.startswith(who.agent_id + ":"):
        raise HTTPException(
            status_code=403, detail=f"Cannot run fsck for agent '{req.agent_id}' — session is bound to agent '{who.agent_id}'"
        )
    # The worker applies the selection (shared.repositories.fsck.Selection).
    return await _start(request, who, "fsck", req.model_dump())


@router.post("/auto-run")
async def auto_run_fsck(request: Request, who: Writer) -> dict[str, Any]:
    """An auto-fsck run now for the caller: check, then apply fixes above the configured thresholds."""
    return await _start(request, who, "auto_fsck", {"incremental": True, "include_raw": False})


async def _own_run(request: Request, who: MnemoryCaller, check_id: int) -> Any:
    async with gateway_state(request).pool.acquire() as conn:
        row = await runs_repo.get_run(conn, check_id)
    if row is None or row["job"] not in FSCK_JOBS or row["tenant"] != Tenant(all=False, key_id=who.principal.key_id).label:
        raise HTTPException(status_code=404, detail="Check not found or expired. Please start a new check.")
    return row


def _actions(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for action in actions:
        if action["action"] in ("delete", "supersede"):  # a superseded fragment leaves the live store
            out.append({"action": "delete", "memory_id": action["id"], "new_content": None, "new_metadata": None})
        else:
            meta = {k: v for k, v in action.items() if k in ("type", "topic", "keywords")}
            out.append({"action": "update", "memory_id": action["id"], "new_content": action.get("content"),
                        "new_metadata": meta or None})
    return out


@router.get("/{check_id}")
async def get_fsck_status(request: Request, check_id: CheckId, who: Reader) -> dict[str, Any]:
    """Poll check status, progress, and results."""
    row = await _own_run(request, who, check_id)
    progress = row["progress"] if isinstance(row["progress"], dict) else json.loads(row["progress"] or "{}")
    status = STATUS.get(row["status"], row["status"])
    phases = int(progress.get("phases") or 5)
    index = phases if progress.get("phase") == "done" else max(0, int(progress.get("phaseIndex") or 1) - 1)
    reply: dict[str, Any] = {
        "check_id": str(check_id), "status": status,
        "progress": {
            "phase": PHASES.get(progress.get("phase", "security"), "security_scan"),
            "total_memories": int(progress.get("fragments") or 0),
            "processed": int(progress.get("fragments") or 0) if progress.get("phase") == "done" else 0,
            "percent": 100 if status == "completed" else int(100 * index / phases),
            "issues_found": int(progress.get("issues") or 0),
        },
        "summary": None, "issues": None, "error": row["error"],
        "created_at": row["started_at"].isoformat() if row["started_at"] else None, "expires_at": None,
    }
    if status != "completed":
        return reply
    async with gateway_state(request).pool.acquire() as conn:
        issues = await fsck_repo.issues_of_run(conn, check_id)
    ids = sorted({fid for issue in issues for fid in issue["fragmentIds"]})
    memories: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), MAX_BY_IDS):  # the affected memories, read by recall as the caller
        found = await upstream.call(request, "recall", "mnemory_by_ids", who, {"ids": ids[start:start + MAX_BY_IDS]})
        memories.update((m["id"], m) for m in found["results"])
    summary = dict.fromkeys(ISSUE_TYPES, 0)
    for issue in issues:
        summary[issue["type"]] = summary.get(issue["type"], 0) + 1
    reply["summary"] = {**summary, "total": len(issues)}
    reply["issues"] = [
        {
            "issue_id": str(issue["id"]), "type": issue["type"], "severity": issue["severity"],
            "confidence": issue["confidence"], "reasoning": issue["reason"],
            "affected_memories": [
                {"id": fid, "content": memories[fid]["memory"], "metadata": memories[fid]["metadata"],
                 "agent_id": memories[fid]["metadata"].get("agent_id")}
                for fid in issue["fragmentIds"] if fid in memories
            ],
            "actions": _actions(issue["actions"]),
            "applied": issue["status"] == "applied",
        }
        for issue in issues
    ]
    return reply


@router.post("/{check_id}/apply")
async def apply_fsck(request: Request, check_id: CheckId, who: Writer, req: FsckApplyRequest | None = None) -> dict[str, Any]:
    """Apply selected fixes from a completed check (all open ones when issue_ids is null or empty)."""
    row = await _own_run(request, who, check_id)
    if row["status"] != "succeeded":
        state = STATUS.get(row["status"], row["status"])
        raise HTTPException(status_code=409, detail=f"Check is {state}; fixes apply to a completed check")
    wanted: list[int] | None = None
    if req is not None and req.issue_ids:
        try:
            wanted = [int(i) for i in req.issue_ids]
        except ValueError:
            raise HTTPException(status_code=422, detail="issue_ids are the check's issue_id values") from None
    async with gateway_state(request).pool.acquire() as conn, conn.transaction():
        before = {i["id"]: i for i in await fsck_repo.issues_of_run(conn, check_id)}
        outcome = await fsck_repo.apply_issues(conn, check_id, wanted)
    details = [{"issue_id": str(i), "status": "applied", "actions_executed": len(before[i]["actions"]), "actions_skipped": 0,
                "error": None} for i in outcome["applied"]]
    details += [{"issue_id": str(f["id"]), "status": "failed", "actions_executed": 0,
                 "actions_skipped": len(before[f["id"]]["actions"]), "error": f["error"]} for f in outcome["failed"]]
    touched = set(outcome["applied"]) | {f["id"] for f in outcome["failed"]}
    skipped = [i for i in (wanted if wanted is not None else []) if i not in touched]
    details += [{"issue_id": str(i), "status": "skipped", "actions_executed": 0, "actions_skipped": 0,
                 "error": "not an open issue of this check"} for i in skipped]
    return {"applied": len(outcome["applied"]), "skipped": len(skipped), "failed": len(outcome["failed"]), "details": details}
