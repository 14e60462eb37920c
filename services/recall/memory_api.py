"""The memory REST API's reads (reference 001): namespaces, entry lists (bare array or page),
relevance search, the injection context, stats, and the export documents.

Search ranks with recall's own layered search (BM25 + vectors + graph + fusion: the "shared
relevance scorer"), then keeps the entries of the namespace asked for. The context is the
enabled namespaces' entries, most recently used first, packed into maxTokens (counted with
the embedding model's tokenizer); unless recordReference=false, each entry it includes gets
one access (last_accessed_at, access_count), which recall's recency and activation read.
The whole-store export streams from a database cursor (GET /v1/memory/export)."""

from __future__ import annotations

import asyncio
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.common.internal import ToolContext
from services.common.rpc import SERVICE_TOKEN_HEADER
from services.recall.search import SearchRequest, layered_search
from services.recall.service import ReadResources
from shared.domain import memory_banks as banks
from shared.domain.memory_banks import MemoryApiError, not_found
from shared.domain.principal import Principal, TenantScope
from shared.domain.search import FragmentFilter
from shared.repositories import memory_entries as entries_repo
from shared.repositories import namespaces as ns_repo

router = APIRouter()
Result = tuple[dict[str, Any], bool]
Operation = Callable[[ReadResources, ToolContext, dict[str, Any]], Awaitable[Any]]
RECENT_ENTRIES = 10


def _uuid(value: Any, what: str = "namespace") -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise not_found(what) from None


def _entry(row: Any) -> dict[str, Any]:
    return banks.entry_wire(row, entries_repo.metadata_of(row["metadata"]))


async def _namespace(conn: asyncpg.Connection, principal: Principal, value: Any) -> asyncpg.Record:
    row = await ns_repo.get_namespace(conn, principal.reads, _uuid(value))
    if row is None:
        raise not_found("namespace")
    return row


async def list_namespaces(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    async with res.pool.acquire() as conn:
        return [banks.namespace_wire(r) for r in await ns_repo.list_namespaces(conn, ctx.principal.reads)]


async def get_namespace(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    async with res.pool.acquire() as conn:
        return banks.namespace_wire(await _namespace(conn, ctx.principal, args["id"]))


async def list_entries(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    """No query parameter: every entry in storage order, a bare array (what older clients
    read as response[0]). Any parameter: {entries, total}, total counted before limit/offset."""
    query = args.get("query")
    async with res.pool.acquire() as conn:
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
        if query is None:
            return [_entry(r) for r in await entries_repo.entries_of(conn, ctx.principal.reads, namespace["id"])]
        rows, total = await entries_repo.page(
            conn, ctx.principal.reads, namespace["id"], tag=query.get("tag"), q=query.get("q"),
            sort=query.get("sort") or "created", descending=(query.get("order") or "asc") == "desc",
            limit=query.get("limit") or banks.PAGE_LIMIT_DEFAULT, offset=query.get("offset") or 0,
        )
    return {"entries": [_entry(r) for r in rows], "total": total}


async def get_entry(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    async with res.pool.acquire() as conn:
        namespace = await _namespace(conn, ctx.principal, args["namespaceId"])
        row = await entries_repo.get_entry(conn, ctx.principal.reads, namespace["id"], str(args["id"]))
    if row is None:
        raise not_found("entry")
    return _entry(row)


async def search(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    """Relevance search across namespaces (or within `namespace`), best first; `limit` caps
    the ranked list. No relevance floor: a search names what it wants ranked."""
    q = args["q"]
    if not q.strip():
        raise MemoryApiError(400, "q must not be empty")
    if banks.byte_length(q) > banks.QUERY_MAX_BYTES:
        raise MemoryApiError(400, f"q must be at most {banks.QUERY_MAX_BYTES} characters")
    limit = args.get("limit") or banks.SEARCH_LIMIT_DEFAULT
    async with res.search_slot(ctx.deadline), res.pool.acquire() as conn:
        only = (await _namespace(conn, ctx.principal, args["namespace"]))["id"] if args.get("namespace") else None
        vector = asyncio.ensure_future(res.embed_query(q))
        corpus = FragmentFilter()
        total = await res.scope_total(conn, ctx, corpus, 0)
        outcome = await layered_search(
            conn, ctx.principal, corpus,
            SearchRequest(text=q, keywords=[], vector=vector, semantic_label="L3", threshold=0.0, filter_only=False),
            total, res.df_cache, pool=res.lender, sizes=res.scope_sizes,
        )
        rows = await entries_repo.by_ids(conn, ctx.principal.reads, [h.id for h in outcome.hits])
    ranked = [rows[h.id] for h in outcome.hits if h.id in rows and (only is None or rows[h.id]["namespace_id"] == only)]
    return [_entry(r) for r in ranked[:limit]]


async def enabled_entries(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    async with res.pool.acquire() as conn:
        enabled = await ns_repo.enabled_ids(conn, ctx.principal.reads)
        return [_entry(r) for r in await entries_repo.in_namespaces(conn, ctx.principal.reads, enabled)]


async def context(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    max_tokens = min(int(args.get("maxTokens") or banks.CONTEXT_TOKENS_DEFAULT), banks.CONTEXT_TOKENS_MAX)
    record = args.get("recordReference", True)
    async with res.pool.acquire() as conn:
        namespaces = {r["id"]: r for r in await ns_repo.list_namespaces(conn, ctx.principal.reads) if r["enabled"]}
        # An entry line costs at least 2 tokens ("- " and a word): no more rows can fit.
        rows = await entries_repo.in_namespaces(conn, ctx.principal.reads, list(namespaces), recent_first=True,
                                                limit=max_tokens // 2 + 1)
        chosen: dict[uuid.UUID, list[Any]] = {}
        used = 0
        for row in rows:
            cost = res.tokens.count(f"- {row['content']}") + 1
            heading = 0 if row["namespace_id"] in chosen else res.tokens.count(f"## {namespaces[row['namespace_id']]['name']}") + 2
            if used + cost + heading > max_tokens:
                continue
            used += cost + heading
            chosen.setdefault(row["namespace_id"], []).append(row)
        ids = [r["id"] for group in chosen.values() for r in group]
        if record and ids:
            await entries_repo.mark_referenced(conn, ids)
    blocks = [
        f"## {namespaces[ns]['name']}\n" + "\n".join(f"- {r['content']}" for r in sorted(group, key=lambda r: (r["created_at"], r["id"])))
        for ns, group in sorted(chosen.items(), key=lambda item: (namespaces[item[0]]["created_at"], str(item[0])))
    ]
    content = "\n\n".join(blocks)
    return {"content": content, "tokenCount": res.tokens.count(content) if content else 0, "entryCount": len(ids),
            "namespaceCount": len(chosen)}


async def stats(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    """Totals over every namespace but agent-experience banks, which stay in perNamespace
    (isAgentExperience) and are summed apart under agentExperience."""
    scope = ctx.principal.reads
    async with res.pool.acquire() as conn:
        namespaces = await ns_repo.list_namespaces(conn, scope)
        counts = await entries_repo.counts_by_namespace(conn, scope)
        experience = [n["id"] for n in namespaces if banks.is_agent_experience(n["description"])]
        per_day = await entries_repo.created_per_day(conn, scope, experience)
        recent = await entries_repo.recently_updated(conn, scope, experience, RECENT_ENTRIES)
    per_ns: dict[uuid.UUID, dict[str, Any]] = {n["id"]: {"entries": 0, "manual": 0, "chars": 0, "byType": {}} for n in namespaces}
    for row in counts:
        item = per_ns.setdefault(row["namespace_id"], {"entries": 0, "manual": 0, "chars": 0, "byType": {}})
        item["entries"] += row["entries"]
        item["manual"] += row["manual"]
        item["chars"] += row["chars"]
        item["byType"][row["type"]] = item["byType"].get(row["type"], 0) + row["entries"]
    main: dict[str, Any] = {"entries": 0, "manual": 0, "chars": 0, "byType": {}}
    side = {"namespaceCount": 0, "entries": 0, "estimatedTokens": 0}
    table = []
    for n in namespaces:
        item = per_ns[n["id"]]
        is_experience = n["id"] in experience
        table.append({"namespaceId": str(n["id"]), "name": n["name"], "enabled": n["enabled"], "entryCount": item["entries"],
                      "autoCount": item["entries"] - item["manual"], "manualCount": item["manual"],
                      "estimatedTokens": banks.estimate_tokens(item["chars"]), "isAgentExperience": is_experience})
        if is_experience:
            side["namespaceCount"] += 1
            side["entries"] += item["entries"]
            side["estimatedTokens"] += banks.estimate_tokens(item["chars"])
            continue
        for name in ("entries", "manual", "chars"):
            main[name] += item[name]
        for kind, n_entries in item["byType"].items():
            main["byType"][kind] = main["byType"].get(kind, 0) + n_entries
    counted = [n for n in namespaces if n["id"] not in experience]
    return {
        "totalEntries": main["entries"],
        "totalNamespaces": len(counted),
        "enabledNamespaces": sum(1 for n in counted if n["enabled"]),
        "bySource": {"auto": main["entries"] - main["manual"], "manual": main["manual"]},
        "byKind": main["byType"],
        "estimatedTokens": banks.estimate_tokens(main["chars"]),
        "perNamespace": table,
        "createdPerDay": [{"date": r["day"].isoformat(), "count": r["n"]} for r in per_day],
        "recentlyUpdated": [_entry(r) for r in recent],
        "agentExperience": side,
    }


async def export_namespace(res: ReadResources, ctx: ToolContext, args: dict[str, Any]) -> Any:
    """The single-namespace document {namespace, entries}: rendered, nothing stored."""
    async with res.pool.acquire() as conn:
        namespace = await _namespace(conn, ctx.principal, args["id"])
        rows = await entries_repo.entries_of(conn, ctx.principal.reads, namespace["id"])
    return {"namespace": banks.namespace_wire(namespace), "entries": [_entry(r) for r in rows]}


async def _document(pool: asyncpg.Pool, scope: TenantScope) -> AsyncIterator[bytes]:
    """The whole-store document, written as it is read: every namespace (agent-experience
    banks included: a backup that silently leaves part of the store out is worse than one
    that says what it cannot restore) with its entries, one cursor at a time."""
    stamp = banks.iso(datetime.now(UTC))
    yield f'{{"version": {banks.EXPORT_VERSION}, "exportedAt": {json.dumps(stamp)}, "namespaces": ['.encode()
    async with pool.acquire() as conn, conn.transaction(readonly=True, isolation="repeatable_read"):
        for index, namespace in enumerate(await ns_repo.list_namespaces(conn, scope)):
            head = "," if index else ""
            yield f'{head}{{"namespace": {json.dumps(banks.namespace_wire(namespace), ensure_ascii=False)}, "entries": ['.encode()
            first = True
            async for row in entries_repo.stream_entries(conn, scope, namespace["id"]):
                yield (("" if first else ",") + json.dumps(_entry(row), ensure_ascii=False)).encode()
                first = False
            yield b"]}"
    yield b"]}"


@router.get("/v1/memory/export")
async def export_store(request: Request) -> Any:
    """GET /memory/export's document, streamed (the gateway relays it as it comes)."""
    supplied = request.headers.get(SERVICE_TOKEN_HEADER, "")
    if not hmac.compare_digest(supplied.encode(), request.app.state.settings.service_token.encode()):
        return JSONResponse({"error": {"code": -32600, "message": "unauthorized caller"}}, status_code=401)
    principal = Principal.from_wire(json.loads(request.headers[banks.PRINCIPAL_HEADER]))
    return StreamingResponse(_document(request.app.state.resources.pool, principal.reads), media_type="application/json")


def _handler(operation: Operation) -> Callable[[Request, ToolContext, dict[str, Any]], Awaitable[Result]]:
    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> Result:
        try:
            return {"value": await operation(request.app.state.resources, ctx, arguments)}, False
        except MemoryApiError as exc:
            return exc.to_result(), True

    return handle


TOOL_HANDLERS = {name: _handler(op) for name, op in {
    "memory_list_namespaces": list_namespaces,
    "memory_get_namespace": get_namespace,
    "memory_list_entries": list_entries,
    "memory_get_entry": get_entry,
    "memory_search": search,
    "memory_enabled_entries": enabled_entries,
    "memory_context": context,
    "memory_api_stats": stats,
    "memory_export_namespace": export_namespace,
}.items()}
