"""AutoReflect: a finished session's decisions, errors, procedures and open questions become
reflect fragments, each linked to the fragment it came from.

The extraction is deterministic (shared.domain.autoreflect); an LLM, when configured, only
adds a narrative, within GEMINI_TIMEOUT_MS and the run's call budget. The fragments are
written by ingest's `reflect` tool, and each item is tied to its source fragment by ingest's
`link` tool, over internal HTTP as the session's key, so quota, workspace rules, dedup and
link rules are ingest's, not re-implemented here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from services.common.rpc import InternalClient
from services.maintenance.runtime import WorkerRuntime
from shared.domain.autoreflect import digest_session
from shared.domain.errors import EngramError
from shared.repositories import locks as locks_repo
from shared.repositories import maintenance as runs_repo
from shared.repositories.maintenance import Tenant

logger = logging.getLogger(__name__)

# Ingest answers reflect in well under a second; 30 s covers a cold embedding model.
INGEST_TIMEOUT = 30.0
SWEEP_BATCH = 50

_NARRATIVE_SYSTEM = (
    "Summarise a finished AI agent work session in 3 to 5 plain sentences for its long-term "
    "memory: what was worked on, what was decided, what failed and how it was fixed, what is "
    "still open. Use only the facts given."
)


class ReflectFailed(RuntimeError):
    """Ingest could not store the reflection; the task retries with backoff."""


async def auto_reflect(rt: WorkerRuntime, *, session_id: str, key_id: str | None, reason: str | None) -> dict[str, Any]:
    pool = rt.pool
    lock = await pool.acquire()
    lock_name = f"engram.reflect:{session_id}"
    try:
        if not await locks_repo.try_lock(lock, lock_name):
            return {"sessionId": session_id, "skipped": "being reflected by another worker"}
        try:
            return await _reflect_locked(rt, lock, session_id, key_id, reason)
        finally:
            await locks_repo.unlock(lock, lock_name)
    finally:
        await pool.release(lock)


async def _reflect_locked(rt: WorkerRuntime, conn: Any, session_id: str, key_id: str | None, reason: str | None) -> dict[str, Any]:
    if await runs_repo.already_reflected(conn, session_id):
        return {"sessionId": session_id, "skipped": "already reflected"}
    session = await runs_repo.session_row(conn, session_id)
    if session is not None and session["key_id"] != key_id:
        # The row is the authority on whose session this is: never reflect into another tenant.
        key_id = session["key_id"]
    fragments = [dict(r) for r in await runs_repo.session_fragments(conn, session_id, key_id)]
    digest = digest_session(fragments)
    tenant = Tenant(all=False, key_id=key_id)
    run_id = await runs_repo.create_run(conn, "auto_reflect", tenant, {"sessionId": session_id, "reason": reason})
    await runs_repo.claim_run(conn, run_id)
    if digest.empty:
        await runs_repo.mark_reflected(conn, session_id)
        result = {"sessionId": session_id, "reflected": 0, "reason": "no decisions, errors, procedures or open questions"}
        await runs_repo.finish_run(conn, run_id, "succeeded", result)
        return result

    budget = rt.llm.budget()
    if rt.llm.configured:
        facts = json.dumps(digest.reflect_arguments(), ensure_ascii=False)
        narrative = rt.llm.complete(_NARRATIVE_SYSTEM, facts, budget)
        if narrative:
            digest.narrative_summary = narrative[:2000]

    principal = await runs_repo.principal_for_key_id(conn, key_id)
    if principal is None:
        result = {"sessionId": session_id, "reflected": 0, "reason": "the session's key no longer exists"}
        await runs_repo.mark_reflected(conn, session_id)
        await runs_repo.finish_run(conn, run_id, "skipped", result)
        return result

    arguments = digest.reflect_arguments()
    ingest = InternalClient({"ingest": InternalClient.replicas(rt.settings.ingest_url)}, rt.settings.service_token, INGEST_TIMEOUT)
    try:
        async with ingest:
            reply, refused = await _call_ingest(ingest, "reflect", principal.to_wire(), session_id, arguments)
            if refused:
                raise ReflectFailed(f"ingest reflect failed: {json.dumps(reply)[:200]}")
            # A link is upserted, so a retried run relinks harmlessly; one ingest refuses (its
            # source forgotten meanwhile) is left out rather than failing the whole reflection.
            linked = 0
            for link in digest.source_links(reply.get("fragments") or []):
                linked += not (await _call_ingest(ingest, "link", principal.to_wire(), session_id, link))[1]
    except ReflectFailed as exc:
        await runs_repo.record_reflect_failure(conn, session_id, str(exc))
        await runs_repo.finish_run(conn, run_id, "failed", {"arguments": arguments, **budget.report()}, str(exc))
        raise
    await runs_repo.mark_reflected(conn, session_id)
    result = {
        "sessionId": session_id,
        "reflected": reply.get("count", len(reply.get("fragments", []) or [])),
        "breakdown": reply.get("breakdown"),
        "linked": linked,
        "llmNarrative": rt.llm.configured and budget.used > 0 and budget.failed == 0,
        **budget.report(),
    }
    await runs_repo.finish_run(conn, run_id, "succeeded", result)
    return result


async def _call_ingest(
    ingest: InternalClient, tool: str, principal: dict[str, Any], session_id: str, arguments: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    """The tool's result and whether it answered isError; ReflectFailed when ingest did not
    answer or refused the call (Unavailable is an EngramError too): the task retries it."""
    try:
        result, is_error = await ingest.call("ingest", tool, arguments, principal, {"id": session_id})
    except EngramError as exc:
        raise ReflectFailed(f"ingest {tool} failed: {exc.code} {exc.message[:200]}") from exc
    return result or {}, is_error


async def unreflected(rt: WorkerRuntime) -> list[dict[str, Any]]:
    async with rt.pool.acquire() as conn:
        rows = await runs_repo.unreflected_sessions(conn, SWEEP_BATCH)
    return [{"session_id": r["id"], "key_id": r["key_id"], "reason": r["end_reason"] or "ended"} for r in rows]
