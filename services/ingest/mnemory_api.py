"""The mnemory REST surface's writes (reference 004), as internal tools of ingest: add, update
and delete a memory, accept an /api/remember request onto the job outbox, delete and
consolidate a session summary. A memory is stored by remember (screening, dedup, quota,
embedding, links), then its mnemory row (shared.repositories.mnemory_memories) is written."""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
from fastapi import Request

from services.common.internal import ToolContext, parse_arguments
from services.ingest import amend as amend_tool
from services.ingest import forget as forget_tool
from services.ingest import remember as remember_tool
from services.ingest.service import Screening, WriteResources, after_commit, invalidate_recall_cache
from shared.contract.base import Id
from shared.contract.mnemory import AddMemoriesBatchRequest, AddMemoryRequest, RememberRequest, SessionArgs, UpdateMemoryRequest
from shared.domain import fragment as frag
from shared.domain import mnemory as model
from shared.domain.principal import Principal
from shared.jobs import JobBuffer
from shared.llm import LLMClient, load_llm
from shared.repositories import mnemory_memories as memories_repo
from shared.repositories import mnemory_sessions as sessions_repo

logger = logging.getLogger(__name__)

ToolResult = tuple[dict[str, Any], bool]
REMEMBER_TASK = "maintenance.mnemory_remember"
# Categories become the fragment's keywords too (recall's exact-term layer finds them).
_MAX_CATEGORY_KEYWORDS = 5


class _AddArgs(AddMemoryRequest):
    # Set by the worker's /api/remember job, never by a client body.
    memory_layer: str = "consolidated"
    session_id: Id | None = None
    idempotency_key: str | None = None


class _UpdateArgs(UpdateMemoryRequest):
    memory_id: Id


def failure(message: str, status: int = 400) -> ToolResult:
    """A refusal the gateway turns into HTTP `status` with {"detail": message}."""
    return {"error": True, "message": message, "status": status}, True


def parse_date(value: str | None, field: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise model.ModelError(f"{field}: not an ISO 8601 date or datetime: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def add_one(res: WriteResources, jobs: JobBuffer, principal: Principal, args: _AddArgs) -> dict[str, Any]:
    """One memory stored: {"results": [{id, memory, event}]} or {"error": true, "message"}."""
    memory_type = model.validate_memory_type(args.memory_type or "episodic")
    categories = model.validate_categories(args.categories or [])
    importance = model.validate_importance(args.importance or "normal")
    model.validate_labels(args.labels)
    event_date = parse_date(args.event_date, "event_date")
    screened = Screening(res.settings).args(args)
    fragment_type = model.FRAGMENT_TYPE[memory_type]
    remember_args: dict[str, Any] = {
        "content": screened.content, "topic": model.topic_for(categories), "type": fragment_type,
        "keywords": [c[:100] for c in categories[:_MAX_CATEGORY_KEYWORDS]],
        "importance": model.IMPORTANCE_VALUE[importance], "isAnchor": bool(args.pinned),
        "agentId": args.caller_agent_id, "idempotencyKey": args.idempotency_key,
    }
    result, is_error = await remember_tool.remember(res, jobs, ToolContext(principal=principal), remember_args)
    if is_error:
        return {"results": [], "error": True, "message": str(result.get("error") or "memory not stored")}
    fresh = not (result.get("duplicate") or result.get("idempotent"))
    expires_at = datetime.now(UTC) + timedelta(days=args.ttl_days) if args.ttl_days else None
    async with res.pool.acquire() as conn:
        await memories_repo.upsert_meta(
            conn, result["id"], memory_type="context" if memory_type == "context" else None, categories=categories,
            role=args.role, memory_layer=args.memory_layer, labels=screened.labels or {},
            event_date=event_date, expires_at=expires_at, session_id=args.session_id, replace=fresh,
        )
    stored = frag.stored_content(screened.content, fragment_type)
    return {"results": [{"id": result["id"], "memory": stored, "event": "ADD" if fresh else "NONE"}]}


# infer=true's replies when the content is stored as given, or nothing is.
STORED_AS_GIVEN_NO_LLM = "infer: no LLM is configured (LLM_BASE_URL, LLM_MODEL), so the content was stored as given"
STORED_AS_GIVEN_LLM_FAILED = "infer: the LLM gave no usable answer, so the content was stored as given"
NOTHING_EXTRACTED = "infer: the LLM found no fact worth remembering in the content, so nothing was stored (infer=false stores it as given)"


@functools.cache
def _extraction_llm() -> LLMClient:
    return load_llm()


async def add_inferred(res: WriteResources, jobs: JobBuffer, principal: Principal, args: _AddArgs) -> dict[str, Any]:
    """infer=true: /api/remember's extraction (shared.domain.mnemory.llm_facts) over the content,
    each fact stored with the caller's fields (its own memory_type when the caller set none).
    Without an LLM, or without a usable answer, the content is stored as given and the reply's
    message says so (the deterministic /api/remember path splits a conversation by speaker,
    which would only rewrite a single stated memory)."""
    llm = _extraction_llm()
    if not llm.configured:
        return _noted(await add_one(res, jobs, principal, args), STORED_AS_GIVEN_NO_LLM)
    # Screened before it leaves for the LLM: a secret is refused or redacted first.
    content = Screening(res.settings).args(args).content
    request = {"messages": [{"role": args.role, "content": content}], "role": args.role, "caller_agent_id": args.caller_agent_id}
    facts = await anyio.to_thread.run_sync(lambda: model.llm_facts(llm, request))
    if facts is None:
        return _noted(await add_one(res, jobs, principal, args), STORED_AS_GIVEN_LLM_FAILED)
    if not facts:
        return {"results": [], "message": NOTHING_EXTRACTED}
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    for fact in facts:
        one = args.model_copy(update={
            "content": fact.content[:frag.MAX_CONTENT_CHARS], "memory_type": args.memory_type or fact.memory_type, "infer": False,
        })
        reply = await add_one(res, jobs, principal, one)
        if reply.get("error"):
            failures.append(str(reply["message"]))
        results.extend(reply["results"])
    if failures and not results:
        return {"results": [], "error": True, "message": "; ".join(failures)}
    message = f"infer: {len(facts)} fact(s) extracted" + (f"; not stored: {'; '.join(failures)}" if failures else "")
    return {"results": results, "message": message}


def _noted(reply: dict[str, Any], message: str) -> dict[str, Any]:
    return reply if reply.get("error") else {**reply, "message": message}


async def add(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(_AddArgs, {**arguments, "memory_layer": "consolidated", "session_id": None, "idempotency_key": None})
    try:
        reply = await (add_inferred if args.infer else add_one)(res, jobs, ctx.principal, args)
    except model.ModelError as exc:
        return failure(str(exc), 422)
    if reply.get("error"):
        return failure(reply["message"])
    return reply, False


async def add_internal(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """The worker's add (a fact extracted by /api/remember): layer, session and idempotency key set."""
    args = parse_arguments(_AddArgs, arguments)
    try:
        reply = await add_one(res, jobs, ctx.principal, args)
    except model.ModelError as exc:
        return failure(str(exc), 422)
    return reply, bool(reply.get("error"))


async def add_batch(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """reference 004: one AddMemoryResponse per item, a failed item answered in place."""
    args = parse_arguments(AddMemoriesBatchRequest, arguments)
    replies: list[dict[str, Any]] = []
    for item in args.memories:
        one = _AddArgs.model_validate({**item.model_dump(), "caller_agent_id": args.caller_agent_id})
        try:
            replies.append(await (add_inferred if one.infer else add_one)(res, jobs, ctx.principal, one))
        except model.ModelError as exc:
            replies.append({"results": [], "error": True, "message": str(exc)})
    return {"items": replies}, False


async def update(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(_UpdateArgs, arguments)
    principal = ctx.principal
    async with res.pool.acquire() as conn:
        row = await memories_repo.owned(conn, principal, args.memory_id)
    if row is None or (args.caller_agent_id and row["agent_id"] not in (args.caller_agent_id, "default")):
        return failure(f"Memory not found: {args.memory_id}", 404)
    try:
        memory_type = model.validate_memory_type(args.memory_type) if args.memory_type else None
        categories = model.validate_categories(args.categories) if args.categories is not None else None
        importance = model.validate_importance(args.importance) if args.importance else None
        labels = model.validate_labels(args.labels) if args.labels is not None else None
        event_date = parse_date(args.event_date, "event_date") if args.event_date is not None else row["event_date"]
    except model.ModelError as exc:
        return failure(str(exc), 422)
    if args.agent_id and args.caller_agent_id and args.agent_id != args.caller_agent_id \
            and not args.agent_id.startswith(args.caller_agent_id + ":"):
        return failure("Cannot set agent_id to a different agent", 403)
    args = Screening(res.settings).args(args)
    amend_args: dict[str, Any] = {"id": args.memory_id}
    if args.content is not None:
        amend_args["content"] = args.content
    if memory_type is not None and model.FRAGMENT_TYPE[memory_type] != row["type"]:
        if model.FRAGMENT_TYPE[memory_type] == "episode":
            return failure("memory_type episodic cannot be set on a stored memory of another type; add it again", 422)
        amend_args["type"] = model.FRAGMENT_TYPE[memory_type]
    if importance is not None:
        amend_args["importance"] = model.IMPORTANCE_VALUE[importance]
    if args.pinned is not None:
        amend_args["isAnchor"] = args.pinned
    if categories is not None:
        amend_args["topic"] = model.topic_for(categories)
    if len(amend_args) > 1:
        result, is_error = await amend_tool.amend(res, jobs, ToolContext(principal=principal), amend_args)
        if is_error:
            return failure(str(result.get("error") or "update refused"))
    kept_type = row["memory_type"] if memory_type is None else ("context" if memory_type == "context" else None)
    expires_at = datetime.now(UTC) + timedelta(days=args.ttl_days) if args.ttl_days else row["expires_at"]
    async with res.pool.acquire() as conn, conn.transaction():
        await memories_repo.upsert_meta(
            conn, args.memory_id, memory_type=kept_type,
            categories=categories if categories is not None else list(row["categories"] or []),
            role=row["role"] or "user", memory_layer=row["memory_layer"] or "consolidated",
            labels=(args.labels or {}) if labels is not None else model.stored_labels(row["labels"]),
            event_date=event_date, expires_at=expires_at, session_id=row["session_id"], replace=True,
        )
        if args.agent_id is not None:
            await memories_repo.set_agent(conn, principal, args.memory_id, args.agent_id or "default")
    return {"status": "updated", "memory_id": args.memory_id}, False


async def delete(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(_UpdateArgs, arguments)
    async with res.pool.acquire() as conn:
        row = await memories_repo.owned(conn, ctx.principal, args.memory_id)
    if row is None or (args.caller_agent_id and row["agent_id"] not in (args.caller_agent_id, "default")):
        return failure(f"Memory not found: {args.memory_id}", 404)
    result, is_error = await forget_tool.forget(res, ToolContext(principal=ctx.principal), {"id": args.memory_id, "force": True})
    if is_error:
        return failure(str(result.get("error") or "delete refused"))
    return {"status": "deleted", "memory_id": args.memory_id}, False


async def remember_accept(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """/api/remember: the request, screened for secrets, recorded as a job in the outbox in
    its own transaction (shared/jobs.py): once this answers, the job survives any crash and
    the worker runs it (a redelivery after a worker crash stores nothing twice)."""
    args = parse_arguments(RememberRequest, arguments)
    if args.role == "assistant" and not args.caller_agent_id:
        return failure("role='assistant' requires agent_id (set X-Agent-Id header)", 422)
    try:
        model.validate_labels(args.labels)
    except model.ModelError as exc:
        return failure(str(exc), 422)
    args = Screening(res.settings).args(args)
    request_id = f"rem_{secrets.token_hex(12)}"
    async with res.pool.acquire() as conn, conn.transaction():
        await jobs.record(
            conn, REMEMBER_TASK, request_id=request_id, principal=ctx.principal.to_wire(), request=args.model_dump(mode="json")
        )
    return {"accepted": True, "request_id": request_id}, False


async def session_delete(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(SessionArgs, arguments)
    principal = ctx.principal
    async with res.pool.acquire() as conn:
        row = await sessions_repo.get_summary(conn, principal, args.session_id)
        if row is None:
            return failure("Session not found", 404)
        if row["consolidation_state"] == "consolidating":
            return failure("Cannot delete session while consolidation is in progress", 409)
        linked = await memories_repo.by_ids(conn, principal, list(row["memory_ids"])) if args.delete_memories else []
    deleted = 0
    for memory in linked:
        # reference 004: only the session's raw memories go; consolidated ones stay.
        if (memory["memory_layer"] or "consolidated") != "raw":
            continue
        _, is_error = await forget_tool.forget(res, ToolContext(principal=principal), {"id": memory["id"], "force": True})
        deleted += 0 if is_error else 1
    async with res.pool.acquire() as conn:
        await sessions_repo.delete_summary(conn, principal, args.session_id)
    return {"deleted_session": True, "deleted_memories": deleted}, False


async def session_consolidate(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """Consolidate one session now: each raw memory it stored that a consolidated memory of
    the tenant already says (same content hash) is removed as a duplicate; the others are
    promoted to the consolidated layer. Returns the result (reference 004)."""
    args = parse_arguments(SessionArgs, arguments)
    principal = ctx.principal
    async with res.pool.acquire() as conn:
        async with conn.transaction():
            row = await sessions_repo.get_summary(conn, principal, args.session_id, lock=True)
            if row is None:
                return failure("Session not found", 404)
            if row["consolidation_state"] == "consolidating":
                return failure("Consolidation already in progress", 409)
            await sessions_repo.set_state(conn, principal, args.session_id, "consolidating")
        try:
            twins, promoted = await _sort_out(conn, principal, list(row["memory_ids"]))
        except (asyncpg.PostgresError, OSError):
            await sessions_repo.set_state(conn, principal, args.session_id, "failed")
            raise
    # The duplicates go through forget, which takes a connection of its own: this call holds
    # none meanwhile. Holding one while waiting for another, DB_POOL_MAX concurrent
    # consolidations each held one and waited forever (the deadlock fixed in recall in 40b1c6b).
    merged: list[str] = []
    try:
        for memory_id in twins:
            _, is_error = await forget_tool.forget(res, ToolContext(principal=principal), {"id": memory_id, "force": True})
            if not is_error:
                merged.append(memory_id)
        async with res.pool.acquire() as conn:
            if promoted:
                await memories_repo.set_layer(conn, promoted, "consolidated")
            await sessions_repo.set_state(conn, principal, args.session_id, "consolidated", promoted)
    except (asyncpg.PostgresError, OSError):
        async with res.pool.acquire() as conn:
            await sessions_repo.set_state(conn, principal, args.session_id, "failed")
        raise
    return {
        "status": "consolidated", "session_id": args.session_id, "consolidated_memory_ids": promoted,
        "promoted": len(promoted), "merged": len(merged),
    }, False


async def _sort_out(conn: asyncpg.Connection, principal: Principal, memory_ids: list[str]) -> tuple[list[str], list[str]]:
    """The session's raw memories as (those a consolidated memory of the tenant already says,
    to remove; the others, to promote)."""
    twins: list[str] = []
    promoted: list[str] = []
    for memory in await memories_repo.by_ids(conn, principal, memory_ids):
        if (memory["memory_layer"] or "consolidated") != "raw":
            continue
        if await memories_repo.consolidated_twin(conn, principal, memory) is not None:
            twins.append(memory["id"])
        else:
            promoted.append(memory["id"])
    return twins, promoted


WriteTool = Callable[[WriteResources, JobBuffer, ToolContext, dict[str, Any]], Awaitable[ToolResult]]


def _handler(tool: WriteTool) -> Callable[[Request, ToolContext, dict[str, Any]], Awaitable[ToolResult]]:
    """As ingest's other write tools: jobs flushed after the commit, the recall cache invalidated."""

    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        res: WriteResources = request.app.state.resources
        jobs = res.job_buffer()
        result = await tool(res, jobs, ctx, arguments)
        await after_commit(res, jobs)
        if not result[1]:
            await invalidate_recall_cache(res, ctx.principal)
        return result

    return handle


TOOL_HANDLERS = {
    "mnemory_add": _handler(add),
    "mnemory_add_internal": _handler(add_internal),
    "mnemory_add_batch": _handler(add_batch),
    "mnemory_update": _handler(update),
    "mnemory_delete": _handler(delete),
    "mnemory_remember_accept": _handler(remember_accept),
    "mnemory_session_delete": _handler(session_delete),
    "mnemory_session_consolidate": _handler(session_consolidate),
}
