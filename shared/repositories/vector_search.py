"""L3, the vector layer: the fragments nearest a query embedding in the caller's filtered scope.

Two plans, chosen per query by the scope's size. HNSW with the filters inside the scan
(hnsw.iterative_scan, set on the pool) visits about k / selectivity tuples, each a heap row
to test the filters, before k of them pass: cheap for a broad scope, hundreds of ms for a
selective one (at 1.1M rows, scopes of 1-10k took the filtered recall's p99 to 600-800 ms).
Ranking the scope exactly costs one heap row per scope row. So a scope of s rows whose walk
would take a graph of G rows is ranked exactly when s is below EXACT_SCOPE_FLOOR or
s^2 <= EXACT_WEIGHT * k * G, the point where both plans cost about the same; s is counted over
the scope indexes (index-only, bounded by that threshold; by the statement itself, or
beforehand, while the caller's model embeds the query, by recall's ScopeSizes from
scope_floors()) and G is the planner's row count from pg_class: of the scope's type graph
when it names one type that has a valid graph (type_graphs), else of the table.

The exact ranking reads its rows from fragments_scope_vectors, a btree over (tenant,
workspace, type, importance) that carries each row's embedding (half precision, as the
table stores it since migration 0034) and the columns the filters test, so a scope is one
contiguous index range read index-only. From the heap the scope cost one page per row (a tenant's rows are
interleaved with everyone else's): at 1M, 14k pages for a scope of 14k rows. The scope is
written as disjoint ranges of that index (scope_workspace_ranges, whose union is
filter_clauses' tenant and workspace scope): an OR of ranges would be a bitmap scan, back on
the heap.

Once the store has its k-means cells (vector_cells: an index like fragments_scope_vectors with
each row's cell between the type and the importance), a countable scope takes one of two
other plans: exactly up to CELLS_EXACT_ROWS, and past it from the query's nearest cells, as
many as hold about CELL_ROWS of the scope's rows (at least MIN_CELL_SHARE of the cells). The
walk is then left to the master key's uncounted scopes. At 1M a scope ranked from cells enough
for ~8,000 rows kept 0.98-1.0 of the exact top 60 past 15k rows at 13-19 ms p50, against the
exact ranking's 18-83 (bench/README.md, session 40); under ~15k the exact ranking was faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import asyncpg
import numpy as np

from shared.domain.principal import (
    Principal,
    SqlParams,
    key_ranges,
    scope_clause,
    scope_workspace_ranges,
    workspace_ranges,
)
from shared.domain.search import FragmentFilter
from shared.repositories.fragments import filter_clauses, narrowing_clauses
from shared.repositories.type_graphs import FRAGMENT_TYPES, GRAPH_PREFIX
from shared.repositories.vector_cells import cell_of

# Scopes up to this many rows are always ranked exactly, whatever the table's size: reading
# them costs less than HNSW's entry into the graph and it is exact.
EXACT_SCOPE_FLOOR = 1000
# How many scope rows an exact ranking may read per tuple the iterative scan would visit
# (k * N / s): an HNSW tuple costs a graph step plus a heap row for the filters, random in a
# heap far larger than shared buffers, while the exact ranking reads the covering index in
# order (~1.1 us a row warm). 4 was chosen when the exact plan read the heap too (both plans
# forced at 100k crossed near 5k rows); with the covering index, at 1M (k = 60), nearest()
# over the filtered suite interleaved per query: 4 -> 16, p95 179 -> 95 and 113 -> 70 ms,
# p99 277 -> 145 and 152 -> 80 (p50 23 -> 28, 29 -> 31); 16 against 40, p95 68 / 90; 8 / 16 / 24
# in a slow stretch, p95 292 / 245 / 224 (bench/README.md, session 15). At 1M the cap was ~31k rows.
# Session 15 knew one graph, the table's. Since then type graphs (session 18) and a cheaper exact
# ranking (half vectors, index-only) moved the crossover, and the cap was still taken from the
# table's rows for every walk. At 1M, both plans forced per query by type (session 30): types
# with a graph of 107-343k rows crossed at ~20k (the smaller graphs) to ~31k (fact, 343k); types
# without one walked the table's graph at 73-637 ms p50 where the exact ranking took 9-28, up to
# 45k rows. 48 with G, the walked graph's rows, puts the caps there: 17-31k for the type graphs,
# ~54k for the table's graph at 1M (17k at 100k, where recall() over the filtered suite, both
# caps interleaved per query, measured the same: p95 38.6 / 36.1 and 32.6 / 32.8 ms). Through
# MCP at 1M, recall restarted on each in turn, the filtered p95 stayed within the passes' spread
# (54-73 against 60-91 ms); what it removes is the walks of 70-640 ms, ~1% of that suite.
EXACT_WEIGHT = 48.0
# The exact ranking used to take the 2k best of the scope by half precision and order those
# by their float vectors, read from the heap by key. At 1M (200 filtered queries, k = 60) both
# orders held the same top 10, 30 and 60 ids in every query, in another order within the list
# in 41 of 200 (ties to the fourth decimal), the similarities within 5.7e-5; the re-rank's heap
# reads cost 1.3-2.4 ms of nearest() p50 by scope size, each query run by both in turn
# (bench/README.md, session 27). Since migration 0034 the half vector is the only one stored.


# With cells: scopes up to this many rows are ranked exactly, larger ones from their cells.
CELLS_EXACT_ROWS = 15_000
# The scope rows the probed cells should hold, on average: the share of the cells probed is
# CELL_ROWS / the scope's rows, at least MIN_CELL_SHARE (all of them for a scope this small).
CELL_ROWS = 8_000
MIN_CELL_SHARE = 0.125
# With cells, scopes are counted up to where the share stops falling (64k rows): ~11 ms of
# Postgres at 64k, paid on a miss of recall's count cache (ScopeSizes). Counting the scope's
# rows cell by cell inside the statement instead, until the cells held CELL_ROWS, cost more
# per recall at 1M (bench/README.md, session 41).
CELLS_COUNT_BOUND = int(CELL_ROWS / MIN_CELL_SHARE)


def graph_settings(ef_search: int) -> dict[str, str]:
    """The session settings a pool that walks HNSW needs (create_pool's server_settings): the
    iterative scan keeps walking until `limit` rows pass the filters instead of filtering
    ef_search candidates down to a short list, and ef_search sets how wide each step looks."""
    return {"hnsw.iterative_scan": "relaxed_order", "hnsw.ef_search": str(int(ef_search))}


# A scope with no index range (a principal that reads nothing).
NO_ROWS = "SELECT NULL::text AS id, NULL::float8 AS distance WHERE FALSE"

# The planner's row count of the table, in _exact_cap's FROM.
TABLE_ROWS = "greatest(c.reltuples, 0)"


def _exact_cap(limit: int, rows: str = TABLE_ROWS) -> str:
    """SQL for the largest scope ranked exactly at this k: `rows` is the SQL of the walked
    graph's row count (_walked_rows), the table's by default."""
    return (
        f"(SELECT greatest({EXACT_SCOPE_FLOOR}, sqrt({EXACT_WEIGHT} * {int(limit)} * {rows})::int)"
        " FROM pg_class c WHERE c.oid = 'fragments'::regclass)"
    )


def _walked_rows(flt: FragmentFilter, params: SqlParams) -> str:
    """SQL for the rows of the graph the walk takes: a scope of one type whose graph is built
    and valid walks that graph (type_graphs), any other scope the whole table's. The walk visits
    about k * G / s tuples of a graph of G rows, so that G, not the table's, sets the cap."""
    if flt.types is None or len(flt.types) != 1:
        return TABLE_ROWS
    graph = params.add(GRAPH_PREFIX + flt.types[0])
    return (
        "coalesce((SELECT greatest(g.reltuples, 0) FROM pg_class g JOIN pg_index i ON i.indexrelid = g.oid"
        f" WHERE g.oid = to_regclass({graph}::text) AND i.indisvalid), {TABLE_ROWS})"
    )


def _index_clauses(
    principal: Principal, flt: FragmentFilter, params: SqlParams, one_type: bool = False, tenant: str | None = None,
) -> list[str]:
    """The scope's clauses on the scope indexes' columns but the workspace: tenant (`tenant`, one
    of scope_ranges, or the whole scope_clause), type (one type by equality when `one_type`, so
    that the range is in importance order), importance."""
    clauses = [scope_clause(principal.reads, params, "f") if tenant is None else tenant]
    if flt.types:
        clauses.append(f"f.type = {params.add(flt.types[0])}" if one_type else f"f.type = ANY({params.add(list(flt.types))}::text[])")
    if flt.min_importance is not None:
        clauses.append(f"f.importance >= {params.add(flt.min_importance)}")
    return clauses


def _scope_counts(principal: Principal, flt: FragmentFilter, params: SqlParams) -> list[str]:
    """Bounded-count subqueries over the index columns of the scope (tenant, workspace or
    global, type, importance): index-only scans whose rows add up to at least the scope's
    size (validity and working-memory scope are left to the ranking). A workspace scope is
    two counts, the workspace's and the global rows', each one index range."""
    base = _index_clauses(principal, flt, params)
    branches = [[*base, workspace] for workspace in workspace_ranges(flt.workspace, params)]
    return [
        f"(SELECT count(*) FROM (SELECT 1 FROM fragments f WHERE {' AND '.join(b)} LIMIT (SELECT cap FROM t) + 1) s)"
        for b in branches
    ]


def _graph(vec: str, where: str, k: str, gate: str = "") -> str:
    """HNSW order with every filter inside the scan. The iterative scan's relaxed order is only
    roughly best first, so the outer query sorts again by `distance + 0`: Postgres 17+ carries a
    materialized CTE's ORDER BY up as a sort order and would skip a plain `ORDER BY distance`
    (pgvector's README, "Iterative index scans"; a clean-clone run returned 0.587 above 0.638)."""
    return f"""
        SELECT f.id, f.embedding <=> {vec}::vector::halfvec AS distance FROM fragments f
        WHERE {gate}f.embedding IS NOT NULL AND {where}
        ORDER BY f.embedding <=> {vec}::vector::halfvec LIMIT {k}
    """


def countable(principal: Principal, flt: FragmentFilter) -> bool:
    """Whether the scope has index ranges to count: the master key without a workspace has
    none and always takes HNSW."""
    return not (principal.is_master and flt.workspace is None)


def _count_bound(limit: int, flt: FragmentFilter, params: SqlParams, cells: int | None) -> str:
    """SQL for how far the scope is counted: just past the exact cap (the walk's crossing), or
    with cells to CELLS_COUNT_BOUND, past which the probed share no longer changes."""
    return str(CELLS_COUNT_BOUND) if cells is not None else _exact_cap(limit, _walked_rows(flt, params))


def scope_rows_statement(principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None) -> tuple[str, list[object]]:
    """The scope's size as nearest() decides by it, counted up to just past its bound, and that
    bound (the exact cap, or CELLS_COUNT_BOUND with cells)."""
    params = SqlParams()
    counts = " + ".join(_scope_counts(principal, flt, params))
    cap = _count_bound(limit, flt, params, cells)
    return f"WITH t AS MATERIALIZED (SELECT {cap} AS cap) SELECT {counts} AS rows, (SELECT cap FROM t) AS cap", params.values


async def scope_size(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
) -> tuple[int, int] | None:
    """scope_rows_statement's count and bound (None for a scope with nothing to count)."""
    if not countable(principal, flt):
        return None
    sql, values = scope_rows_statement(principal, flt, limit, cells)
    row = await conn.fetchrow(sql, *values)
    return int(row["rows"]), int(row["cap"])


@dataclass(frozen=True)
class ScopeFloors:
    """One read of a scope at an importance floor (scope_floors): each index range's rows at
    or above `floor` (None: every row) by importance, each range read up to `bound` + 1 rows
    (a range that had more is `full`), best first where the range is in importance order. It
    answers scope_size's count at `floor` and at every floor above it (but above a full range
    read in the index's order), and, when that count is past the bound, every floor below: so
    one read serves most floors a minute of recalls asks of the scope, where a count served
    one floor (and the floors its count put on the same side of the plan's bounds)."""

    floor: float | None
    bound: int
    ranges: tuple[tuple[dict[float, int], bool], ...]  # per range: rows by importance, read best first

    def rows(self, floor: float | None) -> int | None:
        """scope_size's count at `floor`, or, where the plan is past the bound whatever the
        count, a count past it; None when this read does not tell (a floor below it)."""
        # importance is `real`: Postgres compares the floor in single precision.
        wanted, read = _single(floor), _single(self.floor)
        total = 0
        for counts, ordered in self.ranges:
            full = sum(counts.values()) > self.bound
            if full and wanted <= read:
                total += self.bound + 1  # scope_size's count stops there
            elif wanted >= read and (ordered or not full):
                # A full range read best first holds every row above its last importance (and
                # at or below it the bound + 1 rows it read).
                total += sum(n for importance, n in counts.items() if importance >= wanted)
            else:
                return self._past_bound(wanted, read)
        return total

    def _past_bound(self, wanted: float, read: float) -> int | None:
        """Below the floor read, a count past the bound stays past it."""
        at_floor = self.rows(self.floor)
        return at_floor if wanted <= read and at_floor is not None and at_floor > self.bound else None


def _single(floor: float | None) -> float:
    return -math.inf if floor is None else float(np.float32(floor))


def _in_importance_order(flt: FragmentFilter) -> bool:
    """Whether a workspace's range of one key_id is in importance order under this filter: one
    type, one workspace (the scope index's columns before the importance all fixed)."""
    return flt.types is not None and len(flt.types) == 1 and flt.workspace is not None


def reads_best_first(principal: Principal, flt: FragmentFilter) -> bool:
    """Whether scope_floors_statement reads a workspace's range best first for this scope."""
    return _in_importance_order(flt) and any(one_key for _, one_key in key_ranges(principal.reads, SqlParams()))


def scope_floors_statement(
    principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
) -> tuple[str, list[object], list[bool]]:
    """scope_rows_statement's scope read for its importances instead of counted, as disjoint
    index ranges (scope_ranges x workspace_ranges): each range's rows at or above the floor, up
    to the bound + 1 (one row a range and importance), the bound, and which ranges were read
    best first. The workspace's range of one key_id (a tenant's, or the master key's own rows
    without a key) and one type is, ordered by the index's columns (key_id, workspace, type,
    importance) backwards, index-only: within such a range that is the importance's order, and
    the planner needs no sort for it, where `ORDER BY importance` alone would sort a range
    whose key it knows only by IS NULL. Any other range (several keys or types, the global
    rows) is read in the index's order, which is not the importance's."""
    params = SqlParams()
    one_type = flt.types is not None and len(flt.types) == 1
    ordered = _in_importance_order(flt)
    workspaces = workspace_ranges(flt.workspace, params)
    ranges: list[tuple[list[str], bool]] = []
    for tenant, one_key in key_ranges(principal.reads, params) or [("FALSE", False)]:
        base = _index_clauses(principal, flt, params, one_type=one_type, tenant=tenant)
        # The workspace's range, not its global rows': few enough that the planner may sort them
        # (by its estimate), and a sort reads the whole range where the read stops at the bound.
        ranges += [([*base, ws], one_key and ordered and i == 0) for i, ws in enumerate(workspaces)]
    best = " ORDER BY f.key_id DESC, f.workspace DESC, f.type DESC, f.importance DESC"
    branches = [
        f"(SELECT {i} AS branch, f.importance FROM fragments f WHERE {' AND '.join(clauses)}"
        f"{best if best_first else ''} LIMIT (SELECT cap FROM t) + 1)"
        for i, (clauses, best_first) in enumerate(ranges)
    ]
    cap = _count_bound(limit, flt, params, cells)
    sql = f"""
        WITH t AS MATERIALIZED (SELECT {cap} AS cap),
        read AS (SELECT branch, importance, count(*) AS n FROM ({" UNION ALL ".join(branches)}) r GROUP BY branch, importance)
        SELECT (SELECT cap FROM t) AS cap, array_agg(branch) AS branches, array_agg(importance) AS importances,
               array_agg(n) AS counts
        FROM read
    """
    return sql, params.values, [best_first for _, best_first in ranges]


async def scope_floors(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
) -> ScopeFloors | None:
    """The scope read at its floor (scope_floors_statement), None for a scope with nothing to count."""
    if not countable(principal, flt):
        return None
    sql, values, ordered = scope_floors_statement(principal, flt, limit, cells)
    row = await conn.fetchrow(sql, *values)
    counts: list[dict[float, int]] = [{} for _ in ordered]
    for branch, importance, n in zip(row["branches"] or (), row["importances"] or (), row["counts"] or (), strict=True):
        counts[branch][importance] = n
    return ScopeFloors(flt.min_importance, int(row["cap"]), tuple(zip(counts, ordered, strict=True)))


async def scope_rows(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
) -> int | None:
    """scope_size's count, for nearest()'s `scope_rows`: recall counts while the model embeds
    the query, when the connection is idle (at 1M a scope near the cap is a 31k-row index-only
    count, 3-7 ms)."""
    counted = await scope_size(conn, principal, flt, limit, cells)
    return None if counted is None else counted[0]


def _cells_branch(
    principal: Principal, flt: FragmentFilter, vec: str, k: str, counts: str, cells: int, params: SqlParams,
) -> str:
    """nearest_statement's SQL with cells: the exact ranking up to CELLS_EXACT_ROWS, past it
    the scope's rows in the query's nearest cells. Both read index ranges index-only: the
    exact one fragments_scope_vectors', the other the cells index's, with the cells in its
    index condition (the cell function's COST keeps every other plan dearer: none computes a
    row's cell as it reads it)."""
    narrowing = " AND ".join(["f.embedding IS NOT NULL", *narrowing_clauses(flt, params)])
    ranges = scope_workspace_ranges(principal.reads, flt.workspace, params)
    half = f"{vec}::vector::halfvec"
    exact = " UNION ALL ".join(
        f"SELECT f.id, f.embedding <=> {half} AS distance FROM fragments f"
        f" WHERE (SELECT rows FROM n) <= {CELLS_EXACT_ROWS} AND {rng} AND {narrowing}"
        for rng in ranges
    ) or NO_ROWS
    # The cell follows the type in the index: a scope of any type names every type, so that the
    # cells are an index condition. Without it a scope of no type read the index's range by a
    # filter that computed each row's cell (the suite's store, session 41).
    kinds = "" if flt.types else f" AND f.type = ANY({params.add(list(FRAGMENT_TYPES))}::text[])"
    probed = " UNION ALL ".join(
        f"SELECT f.id, f.embedding <=> {half} AS distance FROM fragments f"
        f" WHERE (SELECT rows FROM n) > {CELLS_EXACT_ROWS} AND {rng}{kinds}"
        f" AND {cell_of(cells, 'f.embedding')} = ANY((SELECT cells FROM probe)::integer[]) AND {narrowing}"
        for rng in ranges
    ) or NO_ROWS
    share = f"greatest({MIN_CELL_SHARE}, least(1.0, {CELL_ROWS}::float8 / greatest((SELECT rows FROM n), 1)))"
    return f"""
        WITH t AS MATERIALIZED (SELECT {CELLS_COUNT_BOUND} AS cap),
        n AS MATERIALIZED (SELECT {counts} AS rows),
        probe AS MATERIALIZED (
            SELECT array_agg(cell) AS cells FROM (
                SELECT cell FROM vector_cells WHERE version = {int(cells)} AND (SELECT rows FROM n) > {CELLS_EXACT_ROWS}
                ORDER BY centroid <#> {half}
                LIMIT (SELECT ceil(count(*) * {share})::int FROM vector_cells WHERE version = {int(cells)})
            ) nearest_cells
        ),
        scope AS NOT MATERIALIZED ({exact}),
        exact AS MATERIALIZED (SELECT id, distance FROM scope ORDER BY distance LIMIT {k}),
        in_cells AS NOT MATERIALIZED ({probed}),
        cells AS MATERIALIZED (SELECT id, distance FROM in_cells ORDER BY distance LIMIT {k})
        SELECT id, distance FROM (SELECT id, distance FROM exact UNION ALL SELECT id, distance FROM cells) hits
        ORDER BY distance + 0
    """


def nearest_statement(
    principal: Principal, flt: FragmentFilter, embedding: np.ndarray, limit: int, scope_rows: int | None = None,
    cells: int | None = None,
) -> tuple[str, list[object]]:
    """nearest()'s SQL and parameters. One statement: the plan not taken is skipped by a
    one-time filter. The master key without a workspace has no scope an index can count
    and always takes HNSW. `scope_rows`, scope_rows()' count at this limit (and `cells`) when
    the caller has it, replaces the statement's own. `cells`, the valid version of the cells
    index (vector_cells.current), puts the cells in the walk's place."""
    params = SqlParams()
    vec = params.add(embedding)
    k = params.add(limit)
    if not countable(principal, flt):
        where = " AND ".join(filter_clauses(principal, flt, params))
        sql = f"WITH nearest AS MATERIALIZED ({_graph(vec, where, k)}) SELECT id, distance FROM nearest ORDER BY distance + 0"
        return sql, params.values
    counts = " + ".join(_scope_counts(principal, flt, params)) if scope_rows is None else f"{params.add(scope_rows)}::bigint"
    if cells is not None:
        return _cells_branch(principal, flt, vec, k, counts, cells, params), params.values
    where = " AND ".join(filter_clauses(principal, flt, params))
    narrowing = " AND ".join(["f.embedding IS NOT NULL", *narrowing_clauses(flt, params)])
    ranges = scope_workspace_ranges(principal.reads, flt.workspace, params)
    exact = " UNION ALL ".join(
        f"SELECT f.id, f.embedding <=> {vec}::vector::halfvec AS distance FROM fragments f"
        f" WHERE (SELECT rows FROM n) <= (SELECT cap FROM t) AND {rng} AND {narrowing}"
        for rng in ranges
    ) or NO_ROWS
    # `scope` is NOT MATERIALIZED: Postgres inlines it, and its rows go straight into the
    # exact ranking's bounded sort. Materialized, every row of a scope near the cap was first
    # written to a tuplestore and read back; at 1M, nearest() over 300 filtered queries (each
    # plan's in a block, two blocks each) went from p95 21.5-21.9 to 18.2-18.4 ms and p99
    # 23.7-24.1 to 19.7-20.0, the same ids in the same order (bench/README.md, session 21).
    sql = f"""
        WITH t AS MATERIALIZED (SELECT {_exact_cap(limit, _walked_rows(flt, params))} AS cap),
        n AS MATERIALIZED (SELECT {counts} AS rows),
        scope AS NOT MATERIALIZED ({exact}),
        exact AS MATERIALIZED (SELECT id, distance FROM scope ORDER BY distance LIMIT {k}),
        graph AS MATERIALIZED ({_graph(vec, where, k, gate="(SELECT rows FROM n) > (SELECT cap FROM t) AND ")})
        SELECT id, distance FROM (SELECT id, distance FROM exact UNION ALL SELECT id, distance FROM graph) hits
        ORDER BY distance + 0
    """
    return sql, params.values


async def nearest(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, embedding: np.ndarray, limit: int,
    scope_rows: int | None = None, cells: int | None = None,
) -> list[tuple[str, float]]:
    """The `limit` fragments closest to `embedding` that pass every filter, best first, as
    (id, cosine similarity).

    Always planned for its parameters (plan_cache_mode, for this statement alone): asyncpg
    prepares it, and after five runs Postgres may keep one generic plan, costed for no scope
    in particular. At 1M fragments that plan took the filtered suite's nearest() from p95 77
    to 535-589 ms (the same queries, one connection, both modes forced in turn), and a
    long-lived recall process fell into it (its statements logged at 150-880 ms)."""
    sql, values = nearest_statement(principal, flt, embedding, limit, scope_rows, cells)
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        rows = await conn.fetch(sql, *values)
    return [(r["id"], 1.0 - float(r["distance"])) for r in rows]
