"""The memory REST API's writes (reference 001): namespaces, entries, bulk delete and move.

The gateway (services/gateway/memory_api/) has checked each request's shape; here are the
rules that need the store: the namespace exists in the caller's tenant (else 404), the byte
limits (400), secret screening of every text (ENGRAM_SECRET_POLICY, as every write path),
and the write itself. An entry is written as a fragment of type fact in the namespace's
tenant, with the namespace's name as topic, its tags as keywords (exactly, none added) and
an embedding from the same model as remember's, so MCP recall finds it. Refusals are tool
errors carrying the HTTP status (MemoryApiError)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from fastapi import Request

from services.common.internal import ToolContext
from services.ingest.service import (
    RETRY_CONFLICTS,
    WriteResources,
    after_commit,
    invalidate_recall_cache,
    lock_quota,
    resolve_workspace,
)
from shared.domain import fragment as frag
from shared.domain import memory_banks as banks
from shared.domain.memory_banks import MemoryApiError, not_found
from shared.domain.principal import Principal
from shared.domain.secrets import SecretFound, screen_value
from shared.jobs import LINK_TASK, JobBuffer
from shared.repositories import memory_entries as entries_repo
from shared.repositories import namespaces as ns_repo
from shared.repositories.fragments import content_morphemes, replace_passages

Result = tuple[dict[str, Any], bool]
Operation = Callable[[WriteResources, ToolContext, dict[str, Any]], Awaitable[Any]]


def memory_handler(operation: Operation) -> Callable[[Request, ToolContext, dict[str, Any]], Awaitable[Result]]:
    """An operation as an internal tool handler: its refusals become tool errors with their
    HTTP status; a secret refused by the policy is a 400 naming the field."""

    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> Result:
        try:
            # A copy per call: a Retrying object keeps the state of the call it runs.
            value: Any = await RETRY_CONFLICTS.copy()(operation, request.app.state.resources, ctx, arguments)
            return {"value": value}, False
        except MemoryApiError as exc:
            return exc.to_result(), True
        except SecretFound as exc:
            return MemoryApiError(400, exc.message).to_result(), True

    return handle


def namespace_uuid(value: Any, what: str = "namespace") -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise not_found(what) from None


def check_storable(**fields: Any) -> None:
    """Postgres stores no NUL character in text or jsonb: a 400 naming the field, not a 500."""
    for name, value in fields.items():
        if holds_nul(value):
            raise MemoryApiError(400, f"{name}: the NUL character cannot be stored")


def holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_nul(v) for v in value)
    return False


def check_namespace_text(name: str | None, description: str | None) -> None:
    check_storable(name=name, description=description)
    if name is not None:
        if not name.strip():
            raise MemoryApiError(400, "name must not be empty")
        if banks.byte_length(name) > banks.NAME_MAX_BYTES:
            raise MemoryApiError(400, f"name must be at most {banks.NAME_MAX_BYTES} bytes")
    if description is not None and banks.byte_length(description) > banks.DESCRIPTION_MAX_BYTES:
        raise MemoryApiError(400, f"description must be at most {banks.DESCRIPTION_MAX_BYTES} bytes")


def check_entry_fields(content: str | None, tags: list[str] | None, metadata: Any = None) -> None:
    check_storable(content=content, tags=tags, metadata=metadata)
    if content is not None:
        if not content.strip():
            raise MemoryApiError(400, "content must not be empty")
        if banks.byte_length(content) > banks.CONTENT_MAX_BYTES:
            raise MemoryApiError(400, f"content must be at most {banks.CONTENT_MAX_BYTES} bytes")
    if tags is not None:
        if len(tags) > banks.TAGS_MAX:
            raise MemoryApiError(400, f"at most {banks.TAGS_MAX} tags per entry")
        for tag in tags:
            if not tag or banks.byte_length(tag) > banks.TAG_MAX_BYTES:
                raise MemoryApiError(400, f"each tag must be 1 to {banks.TAG_MAX_BYTES} bytes")


def screened(res: WriteResources, fields: dict[str, Any]) -> dict[str, Any]:
    """Every text of the write (strings, list items, object keys and values) through the
    secret rules: refused (SecretFound) or redacted, per ENGRAM_SECRET_POLICY."""
    redacted: list[str] = []
    return {name: screen_value(name, value, res.settings.secret_policy, redacted) for name, value in fields.items()}


def new_entry(
    principal: Principal, namespace: asyncpg.Record, content: str, source: str, tags: list[str], *,
    entry_id: str | None = None,
) -> frag.NewFragment:
    """An entry as a fragment of the namespace's tenant (the master key writing into a key's
    namespace writes that key's fragment)."""
    owner = namespace["key_id"]
    workspace, workspace_source = resolve_workspace(principal, None) if owner == principal.key_id else (None, "unscoped")
    return frag.NewFragment(
        id=entry_id or frag.new_fragment_id(), content=content, topic=namespace["name"], type="fact",
        keywords=list(tags), importance=frag.DEFAULT_IMPORTANCE["fact"], content_hash=frag.content_hash(content),
        source=source, key_id=owner, workspace=workspace, workspace_source=workspace_source,
    )


async def _namespace(conn: asyncpg.Connection, principal: Principal, value: Any, *, lock: bool = False) -> asyncpg.Record:
    row = await ns_repo.get_namespace(conn, principal.writes, namespace_uuid(value), lock=lock)
    if row is None:
        raise not_found("namespace")
    return row


async def _finish(res: WriteResources, principal: Principal, jobs: JobBuffer | None = None) -> None:
    if jobs is not None:
        await after_commit(res, jobs)
    await invalidate_recall_cache(res, principal)


# -- namespaces ---------------------------------------------------------------------------


async def create_namespace(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    check_namespace_text(args["name"], args["description"])
    fields = screened(res, {"name": args["name"], "description": args["description"]})
    async with res.pool.acquire() as conn, conn.transaction():
        row = await ns_repo.create_namespace(conn, ctx.principal.key_id, fields["name"], fields["description"])
    return banks.namespace_wire(row)


async def update_namespace(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """PUT: only the fields given change."""
    changes = {k: args[k] for k in ("name", "description", "enabled") if args.get(k) is not None}
    check_namespace_text(changes.get("name"), changes.get("description"))
    changes.update(screened(res, {k: v for k, v in changes.items() if k != "enabled"}))
    async with res.pool.acquire() as conn, conn.transaction():
        row = await ns_repo.update_namespace(conn, ctx.principal.writes, namespace_uuid(args["id"]), changes)
        if row is None:
            raise not_found("namespace")
    await _finish(res, ctx.principal)
    return banks.namespace_wire(row)


async def toggle_namespace(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Sets enabled to the value given (idempotent), never flips it."""
    return await update_namespace(res, ctx, {"id": args["id"], "enabled": bool(args["enabled"])})


async def delete_namespace(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    async with res.pool.acquire() as conn, conn.transaction():
        row = await _namespace(conn, ctx.principal, args["id"], lock=True)
        await ns_repo.delete_namespace(conn, ctx.principal.writes, row["id"])
    await _finish(res, ctx.principal)
    return {}


# -- entries ------------------------------------------------------------------------------


async def create_entry(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    tags = args.get("tags") or []
    check_entry_fields(args["content"], tags, args.get("metadata"))
    fields = screened(res, {"content": args["content"], "tags": tags, "metadata": args.get("metadata")})
    async with res.pool.acquire() as conn:
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
    fragment = new_entry(ctx.principal, namespace, fields["content"], args["source"], fields["tags"])
    await res.embed_fragments([fragment])
    jobs = res.job_buffer()
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"], lock=True)
        quota = await lock_quota(conn, ctx.principal, 1)
        if quota is not None and quota["remaining"] < 0:
            raise MemoryApiError(403, f"fragment_limit_exceeded: this key holds its limit of {quota['limit']} fragments")
        await entries_repo.insert_entries(conn, [fragment], [namespace["id"]], [fields["metadata"]], [None])
        await ns_repo.touch(conn, [namespace["id"]])
        await jobs.record(conn, LINK_TASK, fragment_ids=[fragment.id])
        row = await entries_repo.get_entry(conn, ctx.principal.writes, namespace["id"], fragment.id)
    await _finish(res, ctx.principal, jobs)
    assert row is not None  # noqa: S101 - inserted in this transaction
    return banks.entry_wire(row, entries_repo.metadata_of(row["metadata"]))


async def update_entry(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """PUT: only the fields given change; new content is re-embedded."""
    given = {k: args[k] for k in ("content", "source", "tags", "metadata") if args.get(k) is not None}
    check_entry_fields(given.get("content"), given.get("tags"), given.get("metadata"))
    given.update(screened(res, {k: v for k, v in given.items() if k != "source"}))
    changes: dict[str, Any] = {}
    if "source" in given:
        changes["source"] = given["source"]
    if "tags" in given:
        changes["keywords"] = list(given["tags"])
    if "metadata" in given:
        changes["metadata"] = given["metadata"]
    passages = None
    if "content" in given:
        async with res.pool.acquire() as conn:
            namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
        content = given["content"]
        [(vector, passage_vectors)] = await res.embed_content([(namespace["name"], content)])
        changes.update(content=content, content_hash=frag.content_hash(content), embedding=vector,
                       morphemes=content_morphemes(content))
        passages = passage_vectors
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
        before = await entries_repo.get_entry(conn, ctx.principal.writes, namespace["id"], str(args["id"]), lock=True)
        if before is None:
            raise not_found("entry")
        if "keywords" in changes and "morphemes" not in changes:
            changes["morphemes"] = content_morphemes(before["content"])
        if changes:
            await entries_repo.update_entry(conn, str(args["id"]), changes)
            if passages is not None:
                await replace_passages(conn, [(str(args["id"]), passages)])
            await ns_repo.touch(conn, [namespace["id"]])
        row = await entries_repo.get_entry(conn, ctx.principal.writes, namespace["id"], str(args["id"]))
    await _finish(res, ctx.principal)
    assert row is not None  # noqa: S101 - locked above in this transaction
    return banks.entry_wire(row, entries_repo.metadata_of(row["metadata"]))


async def delete_entry(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
        if not await entries_repo.delete_entries(conn, ctx.principal.writes, namespace["id"], [str(args["id"])]):
            raise not_found("entry")
        await ns_repo.touch(conn, [namespace["id"]])
    await _finish(res, ctx.principal)
    return {}


async def clear_entries(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Empties the namespace and keeps it."""
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"], lock=True)
        deleted = await entries_repo.clear(conn, ctx.principal.writes, namespace["id"])
        await ns_repo.touch(conn, [namespace["id"]])
    await _finish(res, ctx.principal)
    return {"deleted": deleted}


def _ids(args: dict[str, Any]) -> list[str]:
    ids = [str(i) for i in args["ids"]]
    if not 1 <= len(ids) <= banks.BULK_IDS_MAX:
        raise MemoryApiError(400, f"ids must hold 1 to {banks.BULK_IDS_MAX} ids")
    return list(dict.fromkeys(ids))


async def bulk_delete(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Deletes what is there and reports the rest as missing; one write for all ids."""
    ids = _ids(args)
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"], lock=True)
        deleted = set(await entries_repo.delete_entries(conn, ctx.principal.writes, namespace["id"], ids))
        if deleted:
            await ns_repo.touch(conn, [namespace["id"]])
    await _finish(res, ctx.principal)
    return {"deleted": len(deleted), "missing": [i for i in ids if i not in deleted]}


async def move_entries(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Re-homes entries, keeping id, content, source, tags, metadata and timestamps. The
    target must exist, differ from the source and not be an agent-experience bank (moving
    there would write into an agent's system prompt)."""
    ids = _ids(args)
    async with res.pool.acquire() as conn, conn.transaction():
        source = await _namespace(conn, ctx.principal, args["namespaceId"], lock=True)
        target = await ns_repo.get_namespace(conn, ctx.principal.writes, namespace_uuid(args["targetNamespaceId"]), lock=True)
        if target is None:
            raise not_found("target namespace")
        if target["id"] == source["id"]:
            raise MemoryApiError(400, "the target namespace is the source namespace")
        if banks.is_agent_experience(target["description"]):
            raise MemoryApiError(400, "the target namespace is an agent-experience bank; entries cannot be moved into it")
        if target["key_id"] != source["key_id"]:
            raise MemoryApiError(400, "the target namespace belongs to another tenant")
        moved = set(await entries_repo.move(conn, ctx.principal.writes, source["id"], target["id"], ids))
        if moved:
            await ns_repo.touch(conn, [source["id"], target["id"]])
    await _finish(res, ctx.principal)
    return {"moved": len(moved), "missing": [i for i in ids if i not in moved]}


OPERATIONS: dict[str, Operation] = {
    "memory_create_namespace": create_namespace,
    "memory_update_namespace": update_namespace,
    "memory_toggle_namespace": toggle_namespace,
    "memory_delete_namespace": delete_namespace,
    "memory_create_entry": create_entry,
    "memory_update_entry": update_entry,
    "memory_delete_entry": delete_entry,
    "memory_clear_entries": clear_entries,
    "memory_bulk_delete": bulk_delete,
    "memory_move_entries": move_entries,
}
