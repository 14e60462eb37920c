"""One HNSW graph per fragment type, built once the type is large enough to need it.

A filtered recall that names one type and whose scope is past vector_search's exact cap walks
that type's graph (migration 0028): in the whole table's graph such a scope is a few percent
of the rows, in its type's graph a few times more, so the walk visits fewer tuples (at 1M,
p95 49 -> 26 ms for those queries, bench/README.md session 18). What a type graph costs is a
second graph insert on every write of that type (+0.4 ms of Postgres a LoCoMo turn, ~25% of
the write path's own CPU). How many tuples the whole graph's walk visits grows with the
square root of the table (k over the scope's share, and a scope past the cap is at least
sqrt(EXACT_WEIGHT * k * N) rows), so a small store walks the whole graph cheaply and would pay
for its type graphs on every write for nothing. Where a type has its graph, the exact cap is
taken from that graph's rows (vector_search._walked_rows). Migration 0032 drops the graphs of
types with fewer rows than TYPE_GRAPH_MIN_ROWS; the maintenance worker builds a type's graph
(CREATE INDEX CONCURRENTLY, writes go on) once the planner's statistics put the type past it."""

from __future__ import annotations

import logging
from typing import get_args

import asyncpg

from shared.domain.fragment import FragmentType
from shared.repositories import fragment_indexes, locks

logger = logging.getLogger(__name__)

GRAPH_PREFIX = "fragments_embedding_hnsw_"
# A type graph over a few hundred thousand rows takes minutes to build on two cores.
BUILD_TIMEOUT_S = 7200.0
_LOCK = "engram:type-graphs"
# Every type a fragment can have (fragments_type_check allows the same).
FRAGMENT_TYPES: tuple[str, ...] = get_args(FragmentType)


async def existing(conn: asyncpg.Connection) -> dict[str, bool]:
    """The type graphs there are, by type: valid, or left invalid by a concurrent build that
    did not finish."""
    return await fragment_indexes.by_prefix(conn, GRAPH_PREFIX)


async def estimated_rows(conn: asyncpg.Connection) -> dict[str, int]:
    """Rows of each type, from the planner's statistics (fragments.type's most common values
    times the table's row count): reading the types' rows would need an index on type or the
    whole heap. Empty until fragments has been analysed."""
    rows = await conn.fetch(
        """
        SELECT v.kind, (v.freq * greatest(c.reltuples, 0))::bigint AS n
        FROM pg_stats s JOIN pg_class c ON c.oid = 'fragments'::regclass,
             unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(kind, freq)
        WHERE s.schemaname = current_schema() AND s.tablename = 'fragments' AND s.attname = 'type'
        """
    )
    return {r["kind"]: int(r["n"]) for r in rows}


def _definition(kind: str, concurrently: bool) -> str:
    # The whole graph's operator class and parameters (0028).
    return (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {GRAPH_PREFIX}{kind} ON fragments"
        f" USING hnsw (embedding halfvec_cosine_ops) WITH (m = 16, ef_construction = 64) WHERE type = '{kind}'"
    )


async def ensure_type_graphs(conn: asyncpg.Connection, min_rows: int, *, concurrently: bool = True) -> list[str]:
    """Build the graph of every type with at least `min_rows` rows that has none (an invalid
    one, an interrupted concurrent build, is dropped and built again). One run at a time
    across workers; `conn` must not be in a transaction when `concurrently`. Returns the
    types built."""
    if not await locks.try_lock(conn, _LOCK):
        return []
    built: list[str] = []
    try:
        graphs, rows = await existing(conn), await estimated_rows(conn)
        for kind in FRAGMENT_TYPES:
            if graphs.get(kind) or rows.get(kind, 0) < min_rows:
                continue
            if kind in graphs:  # invalid
                await conn.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {GRAPH_PREFIX}{kind}")
            logger.info("building the %s graph (%d rows by the statistics)", kind, rows[kind])
            await conn.execute(_definition(kind, concurrently), timeout=BUILD_TIMEOUT_S)
            built.append(kind)
    finally:
        await locks.unlock(conn, _LOCK)
    return built
