"""The layered search: L2 BM25, L3 vectors, L2.5 graph hop, neighbouring turns, fusion."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import asyncpg
import numpy as np
from cachetools import TTLCache
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.recall.fusion import (
    RM3_FEEDBACK,
    RM3_RESCORE,
    TIME_ANSWER_WEIGHT,
    Pool,
    PoolRow,
    expansion,
    feedback_weights,
    fuse_ranked_lists,
    score,
)
from shared.domain.keywords import korean_morphemes
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter, RankedHit
from shared.repositories import fragments as fragments_repo
from shared.repositories import retrieval, vector_cells, vector_search

logger = logging.getLogger(__name__)

# Candidates each layer contributes before fusion; pageSize is at most 50. Depth 50 and 100
# scored the same on LoCoMo dev (0.735 / 0.739); 60 leaves room for a full page.
LAYER_DEPTH = 60
# Seeds whose one-hop graph neighbours join the pool, and how many neighbours at most.
GRAPH_SEEDS = 10
GRAPH_LIMIT = 30
# Neighbouring turns are looked up around each layer's top this-many (and the graph hop's):
# 30 and 60 scored alike on LoCoMo dev (0.792 / 0.788), and 30 halves the lookup at 100k.
NEIGHBOUR_SEEDS = 30
# The relevance floor: a query whose most similar pooled fragment (its own MiniLM cosine) is
# below this is answered with nothing, so recall says "not found" (_meta no_results, the cue
# to remember) instead of handing over the nearest unrelated fragments. LoCoMo dev with 240
# never-stored questions (bench.eval_locomo --unanswerable): the lowest answerable question's
# best cosine was 0.327, 92% of the never-stored ones were under 0.30 (0.28: 89%, 0.32: 94%
# with no margin left); that best cosine separated better than the passage-mixed similarity
# or BM25. `threshold` replaces it.
RELEVANCE_FLOOR = 0.30
# A query word in at least this share of the scope's fragments (its document frequency, as
# BM25 counts it) is left out of the text the vector layer embeds: MiniLM cannot know that a
# word is everywhere, and a conversation's speaker names (in every turn's lead and half the
# replies) pulled the query toward any turn of that speaker ("What martial arts has John
# done?" ranked John's small talk above "I'm off to do some taekwondo!"). BM25 and the label
# field keep the name; the relevance floor still judges the whole question's embedding.
# Scopes smaller than DENSE_STOP_MIN_SCOPE are left alone (a share of a handful of fragments
# says nothing), and so is a query that would keep none of its other words. Document
# frequencies are counted up to DF_CAP, so above twice that many fragments nothing is left out.
# LoCoMo, ten conversations on one store, in process (bench.locomo_rescore; 0.3 and 0.5 leave
# out the same words: the two speakers' names, the year): off -> 0.5 with DENSE_ORIGINAL_MIX 0.3,
# conv-26 0.824 / MRR 0.563 -> 0.833 / 0.578, conv-30 0.812 / 0.626 -> 0.818 / 0.632, unseen
# eight 0.781 / 0.610 -> 0.792 / 0.607; chosen for every held-out conversation (bench/README,
# "Retrieval on unseen conversations", third round). Adversarial questions (a wrong name on
# purpose) 0.813 -> 0.855.
DENSE_STOP_SHARE = 0.5
DENSE_STOP_MIN_SCOPE = 50
_EDGE = "\"'()[]{}.,;:!?\u2018\u2019\u201c\u201d"
_POSSESSIVE = re.compile(r"['\u2019]s$")
# The vector layer's query: this much of it the whole question's embedding, the rest the
# embedding without the common words (unit vectors mixed, then normalised: its cosine is the
# two cosines mixed, up to a factor z-scoring removes). LoCoMo as above, 0 / 0.3 / 0.5: dev
# 0.825 / 0.582, 0.827 / 0.597, 0.830 / 0.592; unseen eight 0.792 / 0.599, 0.792 / 0.607,
# 0.789 / 0.609 (without the whole question MRR fell below the baseline's 0.610 by 0.011).
DENSE_ORIGINAL_MIX = 0.3
# A question that asks when ("When did ...", "How long ago ...", "In which year ...") is
# answered by a fragment that says when (fusion.TIME_ANSWER_WEIGHT): in conversation that is a
# relative time ("last week", "yesterday", "two years ago").
_ASKS_WHEN = re.compile(
    r"^\W*(when\s+(did|does|do|was|were|is|are|will|would|has|have|had|can|could|should)\b"
    r"|how\s+long\s+ago\b|(in\s+)?(what|which)\s+(year|month|week|day|date)\b)",
    re.IGNORECASE,
)
# The relative-time words as the english configuration stems them (`recently` -> recent,
# `lately` -> late, `weeks` -> week).
TIME_LEXEMES = ("yesterday", "today", "tonight", "ago", "last", "recent", "late", "weekend", "week", "month", "year",
                "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


# Document frequencies are reused this long per (scope, term): BM25's IDF barely moves in
# minutes, and counting a term's rows is the costliest part of L2 at 100k fragments.
DF_TTL_S = 300.0
# A count that reached retrieval.DF_CAP is reused this long: a scope that holds a term that
# often keeps holding it while it grows, and the capped IDF moves little while it shrinks.
# Such terms are most of a large scope's query words and the costly ones to count (DF_CAP
# postings read): at 1M fragments, 241 of 270 distinct query terms, 1.4 ms each against 0.5
# for the rest (bench/README, session 19).
DF_SATURATED_TTL_S = 3600.0
DF_CACHE_MAX = 200_000
# The counts are shared by every recall replica through Redis: a replica that starts (a
# rollout, the autoscaler) finds what its peers counted, and N replicas count a term once
# per TTL instead of N times. The scope part is a hash of the caller's tenant, visible keys
# and workspace, as in the per-process cache, so a tenant never reads another's counts.
DF_KEY = "engram:df:{scope}:{term}"


def df_scope(principal: Principal, corpus: FragmentFilter) -> str:
    """The scope a term's count belongs to: the caller's tenant, visible keys and workspace."""
    scope = json.dumps([principal.key_id, principal.visible_key_ids, corpus.workspace], default=str)
    return hashlib.sha256(scope.encode()).hexdigest()[:32]


def _saturated(df: int) -> bool:
    """Whether a count reached retrieval.DF_CAP (kept DF_SATURATED_TTL_S, not DF_TTL_S)."""
    return df >= retrieval.DF_CAP


class DocumentFrequencies:
    """Term document frequencies by caller scope (owned by the app state): this process's
    cache, then the replicas' shared one in Redis when there is one, then counted. A count
    taken from Redis starts a fresh TTL here, so one lives at most twice its TTL. Counts go
    to Redis after the reply, off the request path, as recall's L1 writes do."""

    def __init__(self, redis: Redis | None = None) -> None:
        self._entries: TTLCache[tuple[str, str], int] = TTLCache(DF_CACHE_MAX, DF_TTL_S)
        self._saturated: TTLCache[tuple[str, str], int] = TTLCache(DF_CACHE_MAX, DF_SATURATED_TTL_S)
        self._redis = redis
        self._writes: set[asyncio.Task[None]] = set()  # shares in flight (held so they are not collected)

    def get_many(self, scope: str, terms: list[str]) -> dict[str, int]:
        out = {}
        for term in terms:
            df = self._saturated.get((scope, term))
            if df is None:
                df = self._entries.get((scope, term))
            if df is not None:
                out[term] = df
        return out

    def put(self, scope: str, dfs: dict[str, int]) -> None:
        for term, df in dfs.items():
            (self._saturated if _saturated(df) else self._entries)[(scope, term)] = df

    async def lookup(
        self, conn: asyncpg.Connection, principal: Principal, corpus: FragmentFilter, terms: list[str]
    ) -> dict[str, int]:
        """Document frequencies of `terms` in the caller's corpus: cached ones, the rest counted."""
        scope = df_scope(principal, corpus)
        dfs = self.get_many(scope, terms)
        missing = [t for t in terms if t not in dfs]
        if missing:
            shared = await self._shared(scope, missing)
            self.put(scope, shared)
            dfs.update(shared)
            missing = [t for t in missing if t not in shared]
        if missing:
            fresh = await retrieval.document_frequencies(conn, principal, corpus, missing)
            self.put(scope, fresh)
            if self._redis is not None and fresh:
                task = asyncio.ensure_future(self._share(self._redis, scope, fresh))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
            dfs.update(fresh)
        return dfs

    async def _shared(self, scope: str, terms: list[str]) -> dict[str, int]:
        """What the replicas counted of `terms` in this scope; {} without Redis or when it fails
        (then the terms are counted, as without it)."""
        if self._redis is None:
            return {}
        try:
            values = await self._redis.mget([DF_KEY.format(scope=scope, term=t) for t in terms])
        except RedisError:
            return {}
        return {t: int(v) for t, v in zip(terms, values, strict=True) if v is not None and v.isdigit()}

    async def settled(self) -> None:
        """Wait for the counts on their way to Redis."""
        while self._writes:
            await asyncio.gather(*self._writes)

    @staticmethod
    async def _share(redis: Redis, scope: str, dfs: dict[str, int]) -> None:
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for term, df in dfs.items():
                    pipe.set(DF_KEY.format(scope=scope, term=term), df, ex=int(DF_SATURATED_TTL_S if _saturated(df) else DF_TTL_S))
                await pipe.execute()
        except RedisError:
            logger.warning("could not share document frequencies through Redis")


@dataclass
class SearchRequest:
    text: str | None
    keywords: list[str]
    vector: asyncio.Future[np.ndarray] | None  # embedding runs while the lexical SQL does
    semantic_label: str  # "L3" for text, "L3kw" for the keywords fallback
    threshold: float | None
    filter_only: bool
    # Embeds texts in one run (the question, and the question without its common words:
    # DENSE_STOP_SHARE); given, it replaces `vector` for the text.
    embed: Callable[[list[str]], Awaitable[list[np.ndarray]]] | None = None


@dataclass
class SearchOutcome:
    hits: list[RankedHit]
    path: list[str]
    via_graph: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (seed, relation)
    vector: np.ndarray | None = None


# How long what one count of the vector layer's scope decided is reused (ScopeSizes): the
# count only picks nearest()'s plan (the exact ranking within the cap, the graph beyond), and
# a minute of writes moves a scope near the cap by little against the two plans' crossing.
SCOPE_SIZE_TTL_S = 60.0
SCOPE_SIZES_MAX = 20_000
# Reads kept a scope: each answers the floors at and above its own.
SCOPE_READS_KEPT = 4


# How long recall trusts what it learned of the store's cells index (vector_cells.current):
# the maintenance worker builds it once, in minutes, and a recall that goes on without it for
# a minute more ranks exactly or walks, as before.
CELLS_TTL_S = 60.0


@dataclass(frozen=True)
class _Read:
    floors: vector_search.ScopeFloors
    at: float  # time.monotonic() of the read


class ScopeSizes:
    """The vector layer's scope counts, kept per process (owned by the app state) for
    SCOPE_SIZE_TTL_S: a filtered recall at 1M counted up to ~50k index entries (3-7 ms of
    Postgres) while the model embedded its query on the same two cores. A scope is the
    caller's tenant, workspace and types; each read of it (vector_search.scope_floors) answers
    its own importance floor and every floor above it, and below it where the count is past
    its bound, so a floor is read only below every floor read so far (SCOPE_READS_KEPT of them
    are kept a scope). A scope whose workspace range is read best first is read from the top,
    which answers every floor. Also which cells index nearest() may probe, for CELLS_TTL_S."""

    def __init__(self) -> None:
        self._reads: TTLCache[tuple[object, ...], tuple[_Read, ...]] = TTLCache(SCOPE_SIZES_MAX, SCOPE_SIZE_TTL_S)
        self._cells: TTLCache[str, int | None] = TTLCache(1, CELLS_TTL_S)

    async def cells(self, pool: asyncpg.Pool) -> int | None:
        """The valid cells version (None without one), looked up once a CELLS_TTL_S."""
        if "version" not in self._cells:
            async with pool.acquire() as conn:
                self._cells["version"] = await vector_cells.current(conn)
        return self._cells.get("version")

    def forget_cells(self) -> None:
        self._cells.clear()

    async def rows(
        self, pool: asyncpg.Pool, principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
    ) -> int | None:
        """A count for nearest()'s `scope_rows` (None for a scope with nothing to count), on a
        connection of `pool` when no read of the scope in the last SCOPE_SIZE_TTL_S answers it."""
        if not vector_search.countable(principal, flt):
            return None
        key = (principal.reads, flt.workspace, flt.types, limit, cells)
        now = time.monotonic()
        for read in self._reads.get(key, ()):
            if now - read.at < SCOPE_SIZE_TTL_S and (known := read.floors.rows(flt.min_importance)) is not None:
                return known
        # Read from the top when the workspace's range is read best first: one read then answers
        # every floor of it (past the bound, at or below the last row it read). Unless a read from
        # the top that did not tell is still kept (a range in the index's order past the bound).
        top = (
            flt.min_importance is not None and vector_search.reads_best_first(principal, flt)
            and not any(read.floors.floor is None and now - read.at < SCOPE_SIZE_TTL_S for read in self._reads.get(key, ()))
        )
        async with pool.acquire() as conn:
            floors = await vector_search.scope_floors(conn, principal, replace(flt, min_importance=None) if top else flt, limit, cells)
            if top and floors is not None and floors.rows(flt.min_importance) is None:
                self._keep(key, floors)
                floors = await vector_search.scope_floors(conn, principal, flt, limit, cells)
        if floors is None:
            return None
        self._keep(key, floors)
        return floors.rows(flt.min_importance)

    def _keep(self, key: tuple[object, ...], floors: vector_search.ScopeFloors) -> None:
        # Another search of the scope may have read it meanwhile: both reads are kept.
        now = time.monotonic()
        kept = tuple(r for r in self._reads.get(key, ()) if now - r.at < SCOPE_SIZE_TTL_S)
        self._reads[key] = (_Read(floors, now), *kept)[:SCOPE_READS_KEPT]


async def _semantic_on(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, req: SearchRequest, scope_rows: int | None = None,
    cells: int | None = None,
) -> tuple[np.ndarray | None, list[tuple[str, float]]]:
    """L3: the query embedding, then its nearest fragments in scope (threshold bounds similarity)."""
    vector = await req.vector if req.vector is not None else None
    if vector is None:
        return None, []
    semantic = await vector_search.nearest(conn, principal, flt, vector, LAYER_DEPTH, scope_rows, cells)
    if req.threshold is not None:
        semantic = [(fid, sim) for fid, sim in semantic if sim >= req.threshold]
    return vector, semantic


async def _semantic(
    pool: asyncpg.Pool, principal: Principal, flt: FragmentFilter, req: SearchRequest, sizes: ScopeSizes,
) -> tuple[np.ndarray | None, list[tuple[str, float]]]:
    if req.vector is None:
        return None, []
    rows = None
    cells = await sizes.cells(pool)
    if not req.vector.done():
        # The vector layer's scope is counted while the model runs, not after it.
        rows = await sizes.rows(pool, principal, flt, LAYER_DEPTH, cells)
    await asyncio.shield(req.vector)  # no second connection is held while the model runs
    async with pool.acquire() as conn:
        try:
            return await _semantic_on(conn, principal, flt, req, rows, cells)
        except asyncpg.UndefinedFunctionError:
            if cells is None:
                raise
            # The version this process knew was retired meanwhile (its function went with its
            # index): learn again, and rank this query as a store without cells would.
            logger.info("vector cells v%d are gone; ranking without them", cells)
            sizes.forget_cells()
            return await _semantic_on(conn, principal, flt, req)


async def _feedback(
    conn: asyncpg.Connection, principal: Principal, corpus: FragmentFilter, df_cache: DocumentFrequencies,
    ranked: list[RankedHit], stats: retrieval.TermStats, scope_total: int,
) -> dict[str, float]:
    """RM3 expansion terms from the first ranking's top hits (their weights in the query)."""
    top = [h.id for h in ranked[:RM3_FEEDBACK]]
    if not top:
        return {}
    weights = feedback_weights(ranked, await retrieval.content_terms(conn, top), stats.idf, await retrieval.stop_lexemes(conn))
    if not weights:
        return {}
    return expansion(weights, await df_cache.lookup(conn, principal, corpus, list(weights)), scope_total)


def dense_stop_possible(scope_total: int) -> bool:
    """Whether any word can be in DENSE_STOP_SHARE of a scope this size: not in a scope too small
    to judge, nor in one whose share is above what document frequencies count to (DF_CAP)."""
    return scope_total >= DENSE_STOP_MIN_SCOPE and DENSE_STOP_SHARE * scope_total <= retrieval.DF_CAP


def _dense_text(text: str, terms: list[str], dfs: dict[str, int], scope_total: int) -> str | None:
    """`text` without the words whose lexeme is in DENSE_STOP_SHARE of the scope, or None when
    no word goes or none of the query's other lexemes would be left."""
    if not dense_stop_possible(scope_total):
        return None
    common = {t for t, df in dfs.items() if df >= DENSE_STOP_SHARE * scope_total}
    if not common or not set(terms) - common:
        return None
    words = text.split()
    kept = [w for w in words if not _stems_to(w, common)]
    return " ".join(kept) if len(kept) < len(words) else None


def _stems_to(word: str, lexemes: set[str]) -> bool:
    """Whether `word` is one of `lexemes` as the english stemmer writes it: the word itself,
    or a stem that cuts at most two letters (`melanie's` -> `melani`) or ends in i for a y."""
    w = _POSSESSIVE.sub("", word.lower().strip(_EDGE))
    return any(w == t or (w.startswith(t) and len(w) - len(t) <= 2) or (t.endswith("i") and w == t[:-1] + "y")
               for t in lexemes if w)


def asks_when(text: str | None) -> bool:
    """Whether the question asks for a time (TIME_ANSWER_WEIGHT)."""
    return bool(text and _ASKS_WHEN.search(text))


async def _nth(vectors: Awaitable[list[np.ndarray]], n: int) -> np.ndarray:
    return (await vectors)[n]


async def _mixed(vectors: Awaitable[list[np.ndarray]]) -> np.ndarray:
    """The vector layer's query from [whole question, without its common words]:
    DENSE_ORIGINAL_MIX of the whole question's embedding."""
    whole, without_common = await vectors
    mixed = DENSE_ORIGINAL_MIX * whole + (1 - DENSE_ORIGINAL_MIX) * without_common
    return (mixed / max(float(np.linalg.norm(mixed)), 1e-12)).astype(np.float32)


async def _closest_whole(
    pool: asyncpg.Pool | None, conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, whole: Awaitable[np.ndarray],
) -> float | None:
    """The whole question's best cosine in scope (the floor's evidence), on a second connection when there is one."""
    vector = await asyncio.shield(whole)
    if pool is None:
        nearest = await vector_search.nearest(conn, principal, flt, vector, 1)
    else:
        async with pool.acquire() as own:
            nearest = await vector_search.nearest(own, principal, flt, vector, 1)
    return nearest[0][1] if nearest else None


def _below_floor(req: SearchRequest, closest: float | None, exact_terms: list[str], pool: Pool) -> bool:
    if req.threshold is not None or closest is None:
        return False  # the caller's threshold replaces the floor; no similarity, no evidence either way
    if exact_terms and any(row.tf.get(t) for row in pool.rows.values() for t in exact_terms):
        # A keyword the caller named, or a Korean morpheme (which the English embedding model
        # cannot judge), is stored: that is evidence enough.
        return False
    return closest < RELEVANCE_FLOOR


def _lexical_extras(text: str | None, keywords: list[str]) -> list[str]:
    extras = [k.lower() for k in keywords]
    if text and any("\uac00" <= ch <= "\ud7a3" for ch in text):
        # The english parser keeps "서버가" whole; the morphemes ("서버") match the index.
        extras.extend(korean_morphemes(text) or [])
    return extras


@dataclass
class _Ahead:
    """What was read of the lexical layer's candidates while the vector layer still ran: their
    neighbouring turns and their pool rows, so that after it only its own are left to read."""

    near: set[str] = field(default_factory=set)  # ids whose turn neighbours were looked up
    around: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)  # ids whose pool rows were looked up
    rows: dict[str, retrieval.PooledFragment] = field(default_factory=dict)


async def _read_ahead(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, lexical: list[tuple[str, float]],
    counted: list[str], vector: Awaitable[np.ndarray] | None,
) -> _Ahead:
    """The lookups layered_search makes after fusion, for the lexical layer's candidates alone:
    turn_neighbours and pool_rows give each id's rows independently of the others, so the
    two halves add up to the one lookup."""
    ahead = _Ahead(near={fid for fid, _ in lexical[:NEIGHBOUR_SEEDS]})
    ahead.around = await retrieval.turn_neighbours(conn, principal, flt, list(ahead.near), width=2)
    ahead.read = {fid for fid, _ in lexical}
    for fid, (before, after) in ahead.around.items():
        ahead.read.update([fid, *before, *after])
    embedding = await vector if vector is not None else None
    ahead.rows = await retrieval.pool_rows(conn, principal, list(ahead.read), counted, embedding)
    return ahead


async def layered_search(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, req: SearchRequest, scope_total: int,
    df_cache: DocumentFrequencies, pool: asyncpg.Pool | None = None, sizes: ScopeSizes | None = None,
) -> SearchOutcome:
    """`pool`, when given, lends a second connection so the vector layer (after the query
    embedding) runs while the lexical layer does; without it the layers run one after the other.
    `sizes` (the process's, when given) answers the vector layer's scope count from earlier ones."""
    sizes = ScopeSizes() if sizes is None else sizes
    path: list[str] = []
    if req.filter_only:
        ranked = await fragments_repo.filtered_recent(conn, principal, flt, LAYER_DEPTH)
        path.append(f"filter:{len(ranked)}")
        return SearchOutcome(fuse_ranked_lists({"filter": ranked}), path)

    # With `embed`, what the vector layer embeds is known once the query's document
    # frequencies are (the cached lookup below): the model then runs while BM25 does.
    dense = req
    whole: Awaitable[np.ndarray] | None = None  # the whole question's embedding, when the vector layer has another
    whole_task: asyncio.Future[float | None] | None = None
    embed_late = req.embed if req.text and dense_stop_possible(scope_total) else None
    if req.embed is not None and req.text and embed_late is None:
        # No word can be left out of what the vector layer embeds (a large scope, or a tiny
        # one): the question alone is embedded, and the model runs from the start, beside
        # the document frequencies, instead of after them.
        dense = replace(req, vector=asyncio.ensure_future(_nth(req.embed([req.text]), 0)), embed=None)
    semantic_task = None
    if pool is not None and dense.embed is None:
        semantic_task = asyncio.ensure_future(_semantic(pool, principal, flt, dense, sizes))
    try:
        lexical_text = req.text or " ".join(req.keywords)
        extras = _lexical_extras(req.text, req.keywords)
        # IDF is a property of the corpus the caller searches (tenant + workspace), not of this
        # query's type / importance / time filters: counted there, it is shared by every query
        # of the scope and stays cached.
        corpus = FragmentFilter(workspace=flt.workspace, caller_session=flt.caller_session)
        terms = await retrieval.query_terms(conn, lexical_text, extras)
        dfs = await df_cache.lookup(conn, principal, corpus, terms)
        if embed_late is not None and req.text:
            dense_text = _dense_text(req.text, terms, dfs, scope_total)
            vectors = asyncio.ensure_future(embed_late([req.text] if dense_text is None else [req.text, dense_text]))
            dense = replace(req, vector=asyncio.ensure_future(_nth(vectors, 0)))
            if dense_text is not None:
                whole = dense.vector
                dense = replace(req, vector=asyncio.ensure_future(_mixed(vectors)))
                path.append(f"dense:-{len(req.text.split()) - len(dense_text.split())}")
                if req.threshold is None and pool is not None and whole is not None:
                    whole_task = asyncio.ensure_future(_closest_whole(pool, conn, principal, flt, whole))
        if pool is not None and semantic_task is None:
            semantic_task = asyncio.ensure_future(_semantic(pool, principal, flt, dense, sizes))
        stats = retrieval.term_stats(dfs, scope_total)
        lexical, avgdl = await retrieval.bm25_candidates(conn, principal, flt, stats, dfs, LAYER_DEPTH)
        path.append(f"L2:{len(lexical)}")
        when = TIME_ANSWER_WEIGHT > 0 and asks_when(req.text)
        # The time words' counts come with the query terms' (scoring ignores terms not in the query).
        counted = list(dict.fromkeys([*stats.idf, *TIME_LEXEMES])) if when else list(stats.idf)
        ahead = _Ahead()
        if semantic_task is not None and not semantic_task.done():
            # The vector layer is still on its own connection (a filtered scope at 1M: its
            # exact ranking or graph walk is most of the query): this one reads what the
            # lexical layer's candidates need meanwhile, off the path that waits for it.
            ahead = await _read_ahead(conn, principal, flt, lexical, counted, dense.vector)
    except BaseException:
        for task in (semantic_task, whole_task):
            if task is not None:
                task.cancel()
        raise
    if semantic_task is not None:
        vector, semantic = await semantic_task
    else:
        vector, semantic = await _semantic_on(conn, principal, flt, dense)
    if vector is not None:
        path.append(f"{req.semantic_label}:{len(semantic)}")

    candidates: dict[str, set[str]] = {}
    for layer, ranked in (("L2", lexical), ("L3", semantic)):
        for fid, _ in ranked:
            candidates.setdefault(fid, set()).add(layer)

    seeds = list(dict.fromkeys([fid for fid, _ in lexical[:GRAPH_SEEDS]] + [fid for fid, _ in semantic[:GRAPH_SEEDS]]))
    via_graph: dict[str, tuple[str, str]] = {}
    for seed, other, relation, _weight in await retrieval.graph_neighbours(conn, principal, flt, seeds, GRAPH_LIMIT):
        if other not in candidates:
            via_graph.setdefault(other, (seed, relation))
        candidates.setdefault(other, set()).add("L2.5")
    if via_graph:
        path.append(f"L2.5:{len(via_graph)}")

    # Turns next to a candidate join the candidates (an answer is often the reply to the
    # turn that matched), and every pooled turn knows its neighbours for window BM25 and
    # borrowing: ±2 around the layers' best candidates covers ±1 around the joined ones.
    best = [fid for ranked in (lexical, semantic) for fid, _ in ranked[:NEIGHBOUR_SEEDS]]
    near_of = list(dict.fromkeys(best + list(via_graph)))
    rest = [fid for fid in near_of if fid not in ahead.near]
    around = ahead.around | await retrieval.turn_neighbours(conn, principal, flt, rest, width=2)
    links: dict[str, list[str | None]] = {}  # id -> [prev, next]

    def adjacent(first: str, second: str) -> None:
        links.setdefault(first, [None, None])[1] = second
        links.setdefault(second, [None, None])[0] = first

    joined = 0
    for fid, (before, after) in around.items():
        run = [*reversed(before), fid, *after]
        for left, right in itertools.pairwise(run):
            adjacent(left, right)
        for near in before[:1] + after[:1]:
            if near not in candidates:
                candidates[near] = {"NB"}
                joined += 1
    if joined:
        path.append(f"NB:{joined}")
    pooled_ids = list(set(candidates) | set(links))
    rows = ahead.rows | await retrieval.pool_rows(conn, principal, [fid for fid in pooled_ids if fid not in ahead.read], counted, vector)
    if req.threshold is not None:
        # threshold bounds similarity: a hit no lexical layer proposed must clear it.
        for fid, layers in list(candidates.items()):
            r = rows.get(fid)
            if not layers & {"L2"} and (r is None or r.cosine is None or r.cosine < req.threshold):
                candidates.pop(fid)
    pooled: dict[str, PoolRow] = {}
    for fid, r in rows.items():
        prev, nxt = links.get(fid) or (None, None)
        pooled[fid] = PoolRow(r.id, r.tf, r.dl, r.cosine, r.importance, r.activation, r.age_days, prev, nxt,
                              passage_cosine=r.passage_cosine, names_label=not stats.idf.keys().isdisjoint(r.label_lexemes),
                              asks=r.asks, says_when=when and any(r.tf.get(t) for t in TIME_LEXEMES))
    pool = Pool(candidates, pooled, avgdl)
    hits = score(pool, stats.idf)
    if whole is None or req.threshold is not None:
        closest = max((r.cosine for r in pool.rows.values() if r.cosine is not None), default=None)
    else:
        # The floor was calibrated on whole questions: their own best cosine decides it.
        closest = await (whole_task if whole_task is not None else _closest_whole(None, conn, principal, flt, whole))
    if _below_floor(req, closest, extras, pool):
        path.append(f"floor:{closest:.2f}")
        return SearchOutcome([], path, {}, vector)
    # Feedback widens a question; a keyword lookup asks for exactly its words.
    extra = await _feedback(conn, principal, corpus, df_cache, hits, stats, scope_total) if req.text else {}
    if extra:
        # The expansion reorders the first ranking's head; counted over the whole pool, its
        # terms lifted fragments from far down (query drift) and cost a 300-id lookup.
        head = [h.id for h in hits[:RM3_RESCORE]]
        for fid, counts in (await retrieval.term_counts(conn, head, list(extra))).items():
            if fid in pool.rows:
                pool.rows[fid].tf.update(counts)
        hits = score(pool, {**stats.idf, **extra})
        path.append(f"RM3:{len(extra)}")
    if when:
        path.append("when")
    return SearchOutcome(hits, path, via_graph, vector)
