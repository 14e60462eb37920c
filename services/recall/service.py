"""The read path: L1 cache, layered search, fusion, token-budget packing, _meta."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import numpy as np
from cachetools import TTLCache
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from services.common.internal import ToolContext, parse_arguments
from services.recall import meta as meta_mod
from services.recall import render
from services.recall.effects import SideEffects
from services.recall.search import LAYER_DEPTH, DocumentFrequencies, ScopeSizes, SearchRequest, layered_search
from services.recall.timeparse import parse_bound
from shared.contract.read import RecallArgs
from shared.domain.errors import InvalidParams, Unavailable
from shared.domain.search import DEPTH_TYPES, FragmentFilter, RankedHit
from shared.domain.tokens import TokenCounter
from shared.embeddings import Embedder
from shared.metrics import L1_LOOKUPS, SEARCH_SLOTS, SEARCHES_SHED, SEARCHES_WAITING
from shared.read_routing import on_primary, reading_replica
from shared.recall_cache import current_generation
from shared.repositories import events as events_repo
from shared.repositories import fragments as fragments_repo
from shared.repositories import recall_views, retrieval, vector_search
from shared.settings import RecallSettings

logger = logging.getLogger(__name__)
L1_LOOKUPS_HIT, L1_LOOKUPS_MISS = L1_LOOKUPS.labels("hit"), L1_LOOKUPS.labels("miss")

# How long a scope's fragment count (BM25's N, the noisy-scope rule) is reused.
SCOPE_TOTAL_TTL_S = 30.0
# Scopes counted per process: one per (key, filter, newest seq) seen in the last 30 s.
SCOPE_TOTALS_MAX = 10_000
SEEN_KEY = "engram:context:seen:{session}"
# Query embeddings kept per process (384 floats each: 1.5 MB).
QUERY_VECTORS = 1024
# Spreading activation: fragments nearest the conversation context join the pool and get
# this much activation.
SPREAD_TOP = 10
SPREAD_ACTIVATION = 0.05


def search_slots(pool_max: int) -> int:
    """Searches one recall process runs at once on a pool of `pool_max` connections.

    A search holds its main connection and borrows up to two more while it runs (search.py:
    the vector layer beside the lexical one, the whole question's best cosine), and gives a
    borrowed one back without waiting on anything. Admitted without a bound, as many searches
    as the pool had connections each held one and waited for a second that none would give
    back: 30 concurrent filtered recalls left a replica answering nothing, ever (bench/README.md,
    session 29). With at most half the pool held as searches' main connections, at least one is
    always free to borrow, so every admitted search finishes; the rest wait for a slot, holding
    nothing."""
    return max(1, pool_max // 2)


# A search still waiting for its slot this close to its caller's deadline is shed: the
# reply would come after the caller gave up (the gateway's UPSTREAM_TIMEOUT), and a backlog
# of such searches would keep an overloaded replica busy for callers long gone.
SHED_MARGIN_S = 1.0


@dataclass
class ReadResources:
    pool: asyncpg.Pool
    embedder: Embedder
    tokens: TokenCounter
    settings: RecallSettings
    effects: SideEffects
    redis: Any | None = None
    _totals: TTLCache[str, int] = field(default_factory=lambda: TTLCache(SCOPE_TOTALS_MAX, SCOPE_TOTAL_TTL_S))
    df_cache: DocumentFrequencies = field(default_factory=DocumentFrequencies)
    scope_sizes: ScopeSizes = field(default_factory=ScopeSizes)

    # L1 writes in flight (held so they are not collected before they finish).
    _cache_writes: set[asyncio.Task[None]] = field(default_factory=set)
    # Taken before a search's main connection, never while holding one (search_slot()).
    searches: asyncio.Semaphore = field(init=False)
    # The pool searches borrow their second connections from; None on a one-connection
    # pool, where borrowing would wait on the search's own main connection: the layers then
    # run one after the other.
    lender: asyncpg.Pool | None = field(init=False)
    _waiting: Gauge = field(init=False)
    _shed: Counter = field(init=False)

    def __post_init__(self) -> None:
        pool_max = self.pool.get_max_size()
        slots = search_slots(pool_max)
        self.searches = asyncio.Semaphore(slots)
        SEARCH_SLOTS.labels("recall").set(slots)
        self._waiting = SEARCHES_WAITING.labels("recall")  # exported from the start, at 0
        self._shed = SEARCHES_SHED.labels("recall")
        self.lender = self.pool if pool_max > 1 else None
        # The most recent QUERY_VECTORS query embeddings: an agent repeats its questions, and
        # writes invalidate L1 but never a text's vector.
        self._vector_of = functools.lru_cache(maxsize=QUERY_VECTORS)(lambda text: self.embedder.embed([text])[0])

    @asynccontextmanager
    async def search_slot(self, deadline: float | None = None) -> AsyncIterator[None]:
        """One of the searches' slots (search_slots), taken before the search's main connection;
        those waiting for one are engram_recall_searches_waiting. A search whose slot has not
        come SHED_MARGIN_S before `deadline` (ToolContext.deadline) is Unavailable instead (503,
        Retry-After at the gateway); a free slot is taken whatever the deadline."""
        with self._waiting.track_inprogress():
            try:
                async with asyncio.timeout_at(None if deadline is None else deadline - SHED_MARGIN_S):
                    await self.searches.acquire()
            except TimeoutError:
                self._shed.inc()
                raise Unavailable("recall service busy: no search slot came before the caller's deadline") from None
        try:
            yield
        finally:
            self.searches.release()

    async def embed_query(self, text: str) -> np.ndarray:
        """The query's embedding (cached), computed off the event loop."""
        return await anyio.to_thread.run_sync(self._vector_of, text)

    async def embed_queries(self, texts: list[str]) -> list[np.ndarray]:
        """One text's embedding (cached), or several in one run of the model: two short
        texts take about as long as one (4.7 vs 4.2 ms), one after the other 3-4 times that."""
        if len(texts) == 1:
            return [await self.embed_query(texts[0])]
        return list(await anyio.to_thread.run_sync(self.embedder.embed, texts))

    async def scope_total(self, conn: asyncpg.Connection, ctx: ToolContext, flt: FragmentFilter, latest: int) -> int:
        """Fragments in the caller's filtered scope, reused for up to SCOPE_TOTAL_TTL_S
        (deletions): an exact count while nothing new was stored in the scope (`latest` is
        its newest seq), a large scope's estimate whatever was stored since (a write moves
        it by one in more than retrieval.SCOPE_COUNT_CAP)."""
        scope = json.dumps([ctx.principal.key_id, ctx.principal.visible_key_ids, flt.__dict__], default=str, sort_keys=True)
        cached = self._totals.get(f"{scope} ~") or self._totals.get(f"{scope} {latest}")
        if cached is not None:
            return cached
        counted = await retrieval.count_in_scope(conn, ctx.principal, flt)
        self._totals[f"{scope} {latest}" if counted.exact else f"{scope} ~"] = counted.rows
        return counted.rows


def build_filter(args: RecallArgs, ctx: ToolContext) -> FragmentFilter:
    types: tuple[str, ...] | None = (args.type,) if args.type else None
    depth_types = DEPTH_TYPES[args.depth] if args.depth else None
    if depth_types is not None:
        types = tuple(t for t in (types or depth_types) if t in depth_types)
    affects = (args.affect,) if isinstance(args.affect, str) else (tuple(args.affect) if args.affect else None)
    as_of = parse_bound("asOf", args.asOf, end=True) if args.asOf else None
    time_from = parse_bound("timeRange.from", args.timeRange.from_, end=False) if args.timeRange else None
    time_to = parse_bound("timeRange.to", args.timeRange.to, end=True) if args.timeRange else None
    if time_from and time_to and time_from > time_to:
        raise InvalidParams("Invalid params: timeRange: from is after to")
    return FragmentFilter(
        workspace=args.workspace if args.workspace is not None else ctx.principal.default_workspace,
        topic=args.topic,
        types=types,
        include_superseded=args.includeSuperseded,
        agent_id=args.agentId if args.agentId and not args.includePeerAgents else None,
        min_importance=args.minImportance,
        is_anchor=args.isAnchor,
        affects=affects,
        case_id=args.caseId,
        resolution_status=args.resolutionStatus,
        phase=args.phase,
        time_from=time_from,
        time_to=time_to,
        as_of=as_of,
        caller_session=ctx.session_id,
    )


def _decode_cursor(cursor: str | None) -> tuple[str, ...]:
    """The ids earlier pages returned. A cursor names what was seen rather than an offset:
    access bumps activation, so a plain offset would skip or repeat hits between pages."""
    if not cursor:
        return ()
    try:
        seen = json.loads(base64.urlsafe_b64decode(cursor.encode()).decode())["seen"]
        if not isinstance(seen, list) or not all(isinstance(i, str) for i in seen):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise InvalidParams("Invalid params: cursor: not a cursor this server issued") from None
    return tuple(seen)


def _encode_cursor(seen: list[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps({"seen": seen}, separators=(",", ":")).encode()).decode()


def _query_type(args: RecallArgs) -> str:
    if args.text and args.keywords:
        return "mixed"
    if args.text:
        return "text"
    if args.keywords:
        return "keywords"
    return "filter"


async def _seen(res: ReadResources, ctx: ToolContext) -> tuple[str, ...]:
    if res.redis is None or not ctx.session_id:
        return ()
    try:
        members = await res.redis.smembers(SEEN_KEY.format(session=ctx.session_id))
    except RedisError:
        return ()
    return tuple(sorted(m.decode() if isinstance(m, bytes) else m for m in members))


def _cache_key(generation: str, ctx: ToolContext, args: RecallArgs, flt: FragmentFilter, explain: bool) -> str:
    body = json.dumps(
        [ctx.principal.key_id, ctx.principal.visible_key_ids, args.model_dump(by_alias=True), flt.__dict__, explain],
        default=str, sort_keys=True,
    )
    return f"engram:recall:l1:{generation}:{hashlib.sha256(body.encode()).hexdigest()}"


async def _cache_get(res: ReadResources, conn: asyncpg.Connection, key: str, latest: int) -> dict[str, Any] | None:
    if res.redis is None:
        return None
    try:
        raw = await res.redis.get(key)
    except RedisError:
        return None
    if raw is None:
        return None
    cached = json.loads(raw)
    if cached.get("latest_seq") != latest:
        return None  # something was stored since: it may belong in this result
    # Belt and braces beside the generation counters: a fragment deleted, amended or
    # superseded since the entry was written is never served from it.
    if not await recall_views.still_fresh(conn, cached["ids"], datetime.fromisoformat(cached["cached_at"])):
        return None
    return cached


async def _cache_put(res: ReadResources, key: str, body: dict[str, Any]) -> None:
    if res.redis is None:
        return
    try:
        await res.redis.set(key, json.dumps(body, default=str), ex=int(res.settings.l1_cache_ttl.total_seconds()))
    except RedisError:
        logger.warning("L1 cache write failed")


def _ids_in(fragments: list[dict[str, Any]]) -> list[str]:
    ids = []
    for f in fragments:
        if "id" in f:
            ids.append(f["id"])
        for key in ("linked", "nearby_context"):
            ids.extend(x["id"] for x in f.get(key, []))
        stitched = f.get("stitched_context")
        if stitched:
            ids.extend(x["id"] for side in ("pre", "post", "causal") for x in stitched[side])
    return ids


async def recall(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    started = time.perf_counter()
    args: RecallArgs = parse_arguments(RecallArgs, arguments)
    if not (args.text or args.keywords or args.topic or args.caseId or args.contextText):
        raise InvalidParams("Invalid params: text: one of text, keywords, topic, caseId or contextText is required")
    flt = build_filter(args, ctx)
    seen_pages = _decode_cursor(args.cursor)
    explain = res.settings.symbolic_explain
    if args.excludeSeen:
        flt.exclude_ids = await _seen(res, ctx)

    async with res.search_slot(ctx.deadline), res.pool.acquire() as conn:
        cache_key = None
        body = None
        latest = await recall_views.latest_seq(conn, ctx.principal)
        if res.redis is not None:
            try:
                cache_key = _cache_key(await current_generation(res.redis, ctx.principal), ctx, args, flt, explain)
            except RedisError:
                cache_key = None
            if cache_key:
                body = await _cache_get(res, conn, cache_key, latest)
                (L1_LOOKUPS_HIT if body is not None else L1_LOOKUPS_MISS).inc()
        activate: dict[str, float] = {}
        if body is None:
            body = await _search(res, conn, ctx, args, flt, seen_pages, explain, activate, latest)
            body["latest_seq"] = latest
            if cache_key:
                # Off the reply's path: serialising the page and the Redis round trip run while
                # the _meta queries wait on Postgres. A write that lands late is harmless (the
                # key carries the generation; the entry its latest seq).
                task = asyncio.ensure_future(_cache_put(res, cache_key, body))
                res._cache_writes.add(task)
                task.add_done_callback(res._cache_writes.discard)
        else:
            body["searchPath"] = "L1 → " + body["searchPath"] if body["searchPath"] else "L1"

        fragments = body["fragments"]
        facts: dict[str, dict[str, Any]] = body["facts"]
        returned = list(facts)
        # A standby cannot advance the search events' sequence: on a replica the id is the primary's.
        reserved = await on_primary(res.pool, conn, events_repo.next_search_event_id) if reading_replica() else None
        event_id, contradictions, errors = await recall_views.meta_facts(conn, returned, reserved)
        scope_total = await res.scope_total(conn, ctx, FragmentFilter(caller_session=ctx.session_id), latest)
        hints = await meta_mod.hints(
            conn, ctx.principal, topic=args.topic, fragments=fragments, facts=facts,
            contradictions=contradictions, errors=errors,
        )
        query_type = _query_type(args)
        suggestion = await meta_mod.suggestion(
            conn, res.redis, ctx.principal, keywords=args.keywords, query_type=query_type, result_count=len(fragments),
            context_text=args.contextText, type_filtered=bool(args.type), scope_total=scope_total,
            top_case=next((f["case_id"] for f in facts.values() if f["case_id"]), None),
        )

    latency_ms = (time.perf_counter() - started) * 1000
    await res.effects.submit({
        "event": events_repo.search_event_row(
            event_id=event_id, key_id=ctx.principal.key_id, session_id=ctx.session_id, query_type=query_type,
            query_text=args.text, keywords=sorted(k.lower() for k in args.keywords) if args.keywords else None,
            filters={k: v for k, v in arguments.items() if k not in ("text", "keywords")},
            result_ids=returned, search_path=body["searchPath"], latency_ms=latency_ms,
        ) | {"at": datetime.now(UTC).isoformat()},
        "accessed": returned,
        "activate": activate,
    })
    meta: dict[str, Any] = {"searchEventId": event_id, "hints": hints, "serverTime": meta_mod.server_time()}
    if suggestion:
        meta["suggestion"] = suggestion
    result = {k: v for k, v in body.items() if k not in ("ids", "cached_at", "facts", "latest_seq")}
    result["_meta"] = meta
    return result, False


async def _search(
    res: ReadResources, conn: asyncpg.Connection, ctx: ToolContext, args: RecallArgs, flt: FragmentFilter,
    seen_pages: tuple[str, ...], explain: bool, activate: dict[str, float], latest: int,
) -> dict[str, Any]:
    cached_at = datetime.now(UTC)
    keywords = list(args.keywords or [])
    semantic_text = args.text or " ".join([*keywords, args.contextText or ""]).strip()
    # A question is embedded by layered_search, once it knows which of its words the whole
    # scope shares (search.DENSE_STOP_SHARE); keywords and context text are embedded now.
    vector = asyncio.ensure_future(res.embed_query(semantic_text)) if semantic_text and not args.text else None
    filter_only = not args.text and not keywords and not args.contextText
    corpus = FragmentFilter(workspace=flt.workspace, caller_session=flt.caller_session)
    scope_total = 0 if filter_only else await res.scope_total(conn, ctx, corpus, latest)
    outcome = await layered_search(
        conn, ctx.principal, flt,
        SearchRequest(text=args.text, keywords=keywords, vector=vector, semantic_label="L3" if args.text else "L3kw",
                      threshold=args.threshold, filter_only=filter_only, embed=res.embed_queries if args.text else None),
        scope_total, res.df_cache, pool=res.lender, sizes=res.scope_sizes,
    )
    hits = outcome.hits
    if args.contextText and res.settings.spreading_activation:
        hits = await _spread(res, conn, ctx, flt, args.contextText, hits, activate, outcome.path)

    cases: list[dict[str, Any]] | None = None
    if args.caseMode:
        cases = await _cases(conn, ctx, hits, args.maxCases)

    if seen_pages:
        earlier = set(seen_pages)
        hits = [h for h in hits if h.id not in earlier]
    window = hits[: args.pageSize]
    rows = await fragments_repo.fetch_by_ids(conn, ctx.principal, [h.id for h in window])
    full = await render.decorate(conn, ctx.principal, args, window, rows, explain=explain, time_filtered=args.timeRange is not None)
    rendered = [render.select_fields(f, args) for f in full]
    if args.includeContext:
        await render.stitch(conn, ctx.principal, rendered, res.tokens, args.tokenBudget)
    fragments, used = render.pack(res.tokens, rendered, args.tokenBudget)
    has_more = len(fragments) < len(hits)
    body: dict[str, Any] = {
        "fragments": fragments,
        "count": len(fragments),
        "totalTokens": used,
        "searchPath": " → ".join(outcome.path),
        "hasMore": has_more,
        "nextCursor": _encode_cursor([*seen_pages, *(h.id for h in window[: len(fragments)])]) if has_more else None,
    }
    if cases is not None:
        body.update({"caseMode": True, "cases": cases, "caseCount": len(cases)})
    body["ids"] = list(dict.fromkeys(_ids_in(fragments) + [f["id"] for f in full]))
    # The returned fragments by id (fields may have dropped "id" from the response itself).
    body["facts"] = {
        f["id"]: {"created_at": f["created_at"], "last_accessed_at": render.iso(rows[f["id"]]["last_accessed_at"]),
                  "case_id": f["case_id"]}
        for f in full[: len(fragments)]
    }
    body["cached_at"] = cached_at.isoformat()
    return body


async def _spread(
    res: ReadResources, conn: asyncpg.Connection, ctx: ToolContext, flt: FragmentFilter, context_text: str,
    hits: list[RankedHit], activate: dict[str, float], path: list[str],
) -> list[RankedHit]:
    """Spreading activation: fragments nearest the conversation context are activated and
    join the ranking just below the query's own hits."""
    vector = await res.embed_query(context_text)
    near = await vector_search.nearest(conn, ctx.principal, flt, vector, SPREAD_TOP)
    path.append(f"SA:{len(near)}")
    floor = min((h.score for h in hits), default=1.0)
    by_id = {h.id: h for h in hits}
    for rank, (fid, sim) in enumerate(near):
        activate[fid] = SPREAD_ACTIVATION
        if fid in by_id:
            by_id[fid].layers.add("SA")
            by_id[fid].score += 0.05 * sim
        else:
            by_id[fid] = RankedHit(fid, floor * 0.5 * sim / (rank + 1), {"SA"})
    return sorted(by_id.values(), key=lambda h: h.score, reverse=True)


async def _cases(conn: asyncpg.Connection, ctx: ToolContext, hits: list[RankedHit], max_cases: int) -> list[dict[str, Any]]:
    """caseMode: group the ranked fragments by case_id, best cases first (goal, events, outcome)."""
    pool = hits[:LAYER_DEPTH * 2]
    rows = await fragments_repo.fetch_by_ids(conn, ctx.principal, [h.id for h in pool])
    grouped: dict[str, list[RankedHit]] = {}
    for h in pool:
        row = rows.get(h.id)
        if row is not None and row["case_id"]:
            grouped.setdefault(row["case_id"], []).append(h)
    ranked = sorted(grouped.items(), key=lambda kv: sum(h.score for h in kv[1]), reverse=True)[:max_cases]
    summaries = await recall_views.case_summaries(conn, ctx.principal, [cid for cid, _ in ranked])
    cases = []
    for case_id, members in ranked:
        summary = summaries.get(case_id, {})
        cases.append({
            "case_id": case_id,
            "goal": summary.get("goal"),
            "outcome": summary.get("outcome"),
            "resolution_status": summary.get("resolution_status"),
            "events": summary.get("events", []),
            "fragment_count": summary.get("fragment_count", len(members)),
            "relevance_score": len(members),
            "fragment_ids": [h.id for h in members],
        })
    return cases
