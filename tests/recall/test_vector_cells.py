"""The k-means cells (shared.repositories.vector_cells) and nearest()'s plans with them
(shared.repositories.vector_search): a scope past CELLS_EXACT_ROWS is ranked from the rows of
its query's nearest cells, read from the cells index with the cells in its index condition;
a smaller one exactly. Which plan ran is read off EXPLAIN ANALYZE of nearest()'s statement.

The suite's store is small, so the thresholds are lowered per test and the centroids are given
(eight well-separated directions, each with its group of rows), not trained, except where the
maintenance job's own training is the subject. Each test retires what it built: the rest of
the suite runs without cells."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import pytest

from services.recall import search
from services.recall.search import ScopeSizes, SearchRequest
from shared.db import create_pool
from shared.domain.search import FragmentFilter
from shared.repositories import vector_cells, vector_search
from tests.recall.test_filtered_vector import DIM, HALF_SIMILARITY, Tenants, _Counting, _store, _unit
from tests.support import Stack, create_api_key, unique

GROUPS = 8
PER_GROUP = 24


@dataclass
class Scene:
    tenants: Tenants
    directions: np.ndarray  # the groups' directions, the version's centroids
    rows: dict[str, tuple[int, float, np.ndarray]]  # the caller's facts: id -> (group, importance, vector)
    foreign: list[str]  # the other tenant's copies of the directions


@pytest.fixture
async def tenants(stack: Stack, conn: asyncpg.Connection) -> Tenants:
    _, mine = await create_api_key(stack.database_url)
    _, theirs = await create_api_key(stack.database_url)
    return Tenants(conn, mine, theirs, unique())


@pytest.fixture
async def scene(tenants: Tenants) -> AsyncIterator[Scene]:
    """GROUPS groups of PER_GROUP facts of the caller in the workspace, each group near its own
    direction (importance 0.3-0.9), and the other tenant's copies of every direction right
    beside them; then a cells version whose centroids are those directions."""
    rng = np.random.default_rng(31)
    directions = np.stack([_unit(rng.normal(size=DIM)) for _ in range(GROUPS)])
    rows: dict[str, tuple[int, float, np.ndarray]] = {}
    for g, d in enumerate(directions):
        # each row farther from its direction than the one before: no two similarities tie
        batch = [
            ("fact", round(0.3 + 0.025 * i, 3), _unit(d + rng.normal(scale=0.01 + 0.004 * i, size=DIM))) for i in range(PER_GROUP)
        ]
        ids = await _store(tenants.conn, tenants.mine, tenants.ws, batch)
        rows.update({fid: (g, imp, v) for fid, (_, imp, v) in zip(ids, batch, strict=True)})
    foreign = await _store(tenants.conn, tenants.theirs, tenants.ws, [("fact", 0.9, d) for d in directions])
    version = await vector_cells.build(tenants.conn, directions, concurrently=False)
    await tenants.conn.execute("VACUUM (ANALYZE) fragments")
    try:
        yield Scene(tenants, directions, rows, foreign)
    finally:
        await vector_cells.retire(tenants.conn, version, concurrently=False)


@pytest.fixture
async def conn(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    async with pool.acquire() as c:
        yield c
    await pool.close()


def _cells_mode(monkeypatch: pytest.MonkeyPatch, exact_rows: int = 10, share: float = 1 / GROUPS) -> None:
    """Scopes past `exact_rows` ranked from cells holding one row each (so the share probed is
    `share`, the least)."""
    monkeypatch.setattr(vector_search, "CELLS_EXACT_ROWS", exact_rows)
    monkeypatch.setattr(vector_search, "CELL_ROWS", 1)
    monkeypatch.setattr(vector_search, "MIN_CELL_SHARE", share)


async def _plan(conn: asyncpg.Connection, sql: str, values: list[object], analyze: bool = True) -> dict[str, Any]:
    mode = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    return json.loads(await conn.fetchval(f"EXPLAIN ({mode}) {sql}", *values))[0]["Plan"]


def _nodes(plan: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """Every plan node with the CTE it belongs to."""
    out: list[tuple[str | None, dict[str, Any]]] = []

    def walk(node: dict[str, Any], cte: str | None) -> None:
        name = node.get("Subplan Name", "")
        cte = name.removeprefix("CTE ") if name.startswith("CTE ") else cte
        out.append((cte, node))
        for child in node.get("Plans", []):
            walk(child, cte)

    walk(plan, None)
    return out


def _reads(plan: dict[str, Any], cte: str) -> list[dict[str, Any]]:
    """The executed scans of fragments inside `cte`."""
    return [n for c, n in _nodes(plan) if c == cte and n.get("Relation Name") == "fragments" and n.get("Actual Loops", 0) > 0]


def _brute_force(scene: Scene, query: np.ndarray, floor: float, groups: set[int] | None, k: int) -> list[tuple[str, float]]:
    scored = [
        (fid, float(np.dot(query, v))) for fid, (g, imp, v) in scene.rows.items()
        if imp >= floor and (groups is None or g in groups)
    ]
    return sorted(scored, key=lambda x: -x[1])[:k]


async def test_a_row_s_cell_is_its_nearest_centroid_and_a_version_is_written_once(scene: Scene) -> None:
    conn = scene.tenants.conn
    version = await vector_cells.current(conn)
    assert version is not None and (await vector_cells.existing(conn))[version] is True
    ids = list(scene.rows)
    got = dict(await conn.fetch(
        f"SELECT id, {vector_cells.cell_of(version, 'embedding')} FROM fragments WHERE id = ANY($1::text[])", ids
    ))
    want = {fid: int(np.argmax(scene.directions @ v)) for fid, (_, _, v) in scene.rows.items()}
    assert got == want
    assert set(got.values()) == set(range(GROUPS))  # every group its own cell
    with pytest.raises(asyncpg.RestrictViolationError):
        await conn.execute("UPDATE vector_cells SET cell = cell WHERE version = $1", version)
    definition = await conn.fetchval("SELECT pg_get_indexdef($1::regclass)", vector_cells.index_name(version))
    assert f"{vector_cells.function_name(version)}(embedding), importance) INCLUDE" in definition
    cost = await conn.fetchval("SELECT procost FROM pg_proc WHERE proname = $1", vector_cells.function_name(version))
    assert cost == vector_cells.FUNCTION_COST


async def test_a_large_scope_is_ranked_from_its_query_s_nearest_cells(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    """One cell of eight probed: the answer is that cell's rows of the scope, best first with
    their own similarities, k filled, the other tenant's copy of the query in the same cell
    kept out, read index-only from the cells index with the cells in its index condition."""
    t = scene.tenants
    version = await vector_cells.current(t.conn)
    _cells_mode(monkeypatch)
    query = _unit(scene.directions[3] + np.random.default_rng(5).normal(scale=0.01, size=DIM))
    flt = FragmentFilter(workspace=t.ws, types=("fact",), min_importance=0.4)
    got = await vector_search.nearest(t.conn, t.principal, flt, query, 10, cells=version)

    want = _brute_force(scene, query, 0.4, {3}, 10)
    assert len(want) == 10
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=HALF_SIMILARITY)
    assert not set(scene.foreign) & {i for i, _ in got}

    sql, values = vector_search.nearest_statement(t.principal, flt, query, 10, cells=version)
    plan = await _plan(t.conn, sql, values)
    assert not _reads(plan, "exact")
    reads = _reads(plan, "cells")
    assert {(n["Node Type"], n["Index Name"]) for n in reads} == {("Index Only Scan", vector_cells.index_name(version))}
    assert all(vector_cells.function_name(version) in n["Index Cond"] for n in reads)
    # only the probed cell's rows at the floor were read: the workspace's and none of the global rows'
    in_cell = len(_brute_force(scene, query, 0.4, {3}, 999))
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) == in_cell


async def test_probing_every_cell_is_the_exact_ranking(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    t = scene.tenants
    version = await vector_cells.current(t.conn)
    query = _unit(scene.directions[1] + scene.directions[6])  # between two groups
    flt = FragmentFilter(workspace=t.ws, types=("fact",), min_importance=0.35)
    in_both = len(_brute_force(scene, query, 0.35, {1, 6}, 999))
    _cells_mode(monkeypatch, share=1.0)
    every = await vector_search.nearest(t.conn, t.principal, flt, query, 60, cells=version)
    _cells_mode(monkeypatch, share=2 / GROUPS)
    two = await vector_search.nearest(t.conn, t.principal, flt, query, 60, cells=version)

    want = _brute_force(scene, query, 0.35, None, 60)
    assert len(every) == 60 and {i for i, _ in every} == {i for i, _ in want}
    assert [s for _, s in every] == pytest.approx([s for _, s in want], abs=HALF_SIMILARITY)
    # the query's two nearest cells are groups 1 and 6: all their rows, and nothing else
    assert {i for i, _ in two} == {i for i, _ in want[:in_both]}
    assert {scene.rows[i][0] for i, _ in two} == {1, 6} and len(two) == in_both
    assert [s for _, s in two] == pytest.approx([s for _, s in want[:in_both]], abs=HALF_SIMILARITY)


async def test_a_scope_within_the_exact_rows_is_ranked_exactly_with_cells(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    t = scene.tenants
    version = await vector_cells.current(t.conn)
    _cells_mode(monkeypatch, exact_rows=10**6)
    query = scene.directions[2]
    flt = FragmentFilter(workspace=t.ws, types=("fact",), min_importance=0.5)
    sql, values = vector_search.nearest_statement(t.principal, flt, query, 8, cells=version)
    plan = await _plan(t.conn, sql, values)

    assert _reads(plan, "exact") and not _reads(plan, "cells")
    got = await vector_search.nearest(t.conn, t.principal, flt, query, 8, cells=version)
    assert [i for i, _ in got] == [i for i, _ in _brute_force(scene, query, 0.5, None, 8)]
    # a count given beforehand decides in place of the statement's own
    given = await vector_search.scope_rows(t.conn, t.principal, flt, 8, cells=version)
    assert given == len(_brute_force(scene, query, 0.5, None, 999))
    monkeypatch.setattr(vector_search, "CELLS_EXACT_ROWS", given - 1)
    sql, values = vector_search.nearest_statement(t.principal, flt, query, 8, scope_rows=given, cells=version)
    plan = await _plan(t.conn, sql, values)
    assert _reads(plan, "cells") and not _reads(plan, "exact")


@pytest.mark.parametrize("types", [("fact",), ("fact", "decision"), None])
@pytest.mark.parametrize("share", [1 / GROUPS, 5 / GROUPS, 1.0])
async def test_no_plan_computes_a_row_s_cell_as_it_reads_it(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, types: tuple[str, ...] | None, share: float,
) -> None:
    """Session 40's trap: with many cells in the array the planner read the old covering index
    and ran the cell function on each row as a filter (2.3 s a statement at 1M). Whatever the
    share probed and the scope's types, the function is in no plan node's filter."""
    t = scene.tenants
    version = await vector_cells.current(t.conn)
    _cells_mode(monkeypatch, share=share)
    flt = FragmentFilter(workspace=t.ws, types=types, min_importance=0.3)
    sql, values = vector_search.nearest_statement(t.principal, flt, scene.directions[0], 20, cells=version)
    plan = await _plan(t.conn, sql, values)
    function = vector_cells.function_name(version)
    filtered = [n for _, n in _nodes(plan) if function in n.get("Filter", "") or function in n.get("Recheck Cond", "")]
    assert not filtered, [(n.get("Index Name"), n.get("Index Cond"), n.get("Filter")) for n in filtered]
    reads = _reads(plan, "cells")
    assert reads and all(function in n.get("Index Cond", "") for n in reads)


async def test_a_read_of_a_scope_with_cells_answers_the_floors_above_it(
    stack: Stack, scene: Scene, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With cells the plan is exact up to CELLS_EXACT_ROWS and past it the share of cells falls
    with the count until CELLS_COUNT_BOUND, so a floor between the two needs its count. A scope
    of one tenant and one type is read best first from the top, once: past the bound that read
    gives the count above its last row's importance, and past the bound at or below it."""
    t = scene.tenants
    version = await vector_cells.current(t.conn)
    monkeypatch.setattr(vector_search, "CELLS_EXACT_ROWS", 40)
    monkeypatch.setattr(vector_search, "CELLS_COUNT_BOUND", 120)
    counting = _Counting(monkeypatch)
    sizes = ScopeSizes()
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)

    async def rows(floor: float) -> int | None:
        flt = FragmentFilter(workspace=t.ws, types=("fact",), min_importance=floor)
        return await sizes.rows(pool, t.principal, flt, 10, version)

    try:
        # eight groups of 24 facts at 0.3-0.875 (step 0.025), read once from the top (best
        # first): 121 rows, 0.875 down to 0.5
        assert await rows(0.79) == 8 * 4  # within the exact rows
        assert await rows(0.84) == 8 * 2
        assert await rows(0.59) == 8 * 12
        assert await rows(0.59) == 96
        assert await rows(0.64) == 8 * 10
        assert await rows(0.29) == 121  # at or below 0.5: past the bound
        assert await rows(0.34) == 121
        assert await rows(0.2) == 121
        assert await rows(0.5) == 121
        assert await rows(0.51) == 8 * 15  # above 0.5: the count
        assert await rows(0.55) == 8 * 14
        assert counting.floors == [None]
    finally:
        await pool.close()


async def test_recall_learns_the_cells_and_goes_on_without_a_retired_version(
    stack: Stack, scene: Scene, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The vector layer inside a search: recall looks the version up (once a CELLS_TTL_S) and
    ranks a large scope from its cells; when that version is retired under it, the query is
    ranked as without cells and the next lookup finds none."""
    t = scene.tenants
    _cells_mode(monkeypatch)
    version = await vector_cells.current(t.conn)
    query = scene.directions[5]
    flt = FragmentFilter(workspace=t.ws, types=("fact",), min_importance=0.3)
    sizes = ScopeSizes()
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    try:
        async def semantic() -> list[tuple[str, float]]:
            loop = asyncio.get_running_loop()
            vector: asyncio.Future[np.ndarray] = loop.create_future()
            loop.call_later(0.2, vector.set_result, query)  # the scope is counted while the "model" runs
            req = SearchRequest(text=None, keywords=[], vector=vector, semantic_label="L3", threshold=None, filter_only=False)
            _, hits = await search._semantic(pool, t.principal, flt, req, sizes)
            return hits

        first = await semantic()
        assert await sizes.cells(pool) == version
        assert {scene.rows[i][0] for i, _ in first} == {5}  # one cell of eight: group 5's rows only
        assert len(first) == PER_GROUP

        await vector_cells.retire(t.conn, version, concurrently=False)
        assert await sizes.cells(pool) == version  # still what this process learned
        after = await semantic()
        assert await sizes.cells(pool) is None
        want = _brute_force(scene, query, 0.3, None, search.LAYER_DEPTH)
        assert len(after) == search.LAYER_DEPTH
        assert [s for _, s in after] == pytest.approx([s for _, s in want], abs=HALF_SIMILARITY)
        assert {scene.rows[i][0] for i, _ in after} > {5}  # past group 5: not the cells' answer
    finally:
        await pool.close()


async def test_the_worker_trains_and_builds_the_cells_once_the_store_has_the_rows(tenants: Tenants) -> None:
    """maintenance.vector_cells's work: nothing under VECTOR_CELLS_MIN_ROWS; past it a version
    trained on the store's own embeddings (unit centroids) and its valid index; nothing more
    while a valid version stands; a build that did not finish (an invalid index, or centroids
    without one) is retired and built again."""
    conn = tenants.conn
    rng = np.random.default_rng(9)
    await _store(conn, tenants.mine, tenants.ws, [("fact", 0.5, _unit(rng.normal(size=DIM))) for _ in range(64)])
    await conn.execute("ANALYZE fragments")
    assert await vector_cells.ensure_cells(conn, 10**9, cells=4, sample_size=500) is None
    assert await vector_cells.current(conn) is None
    version = await vector_cells.ensure_cells(conn, 1, cells=4, sample_size=500)
    try:
        assert version is not None and await vector_cells.current(conn) == version
        norms = [float(r["n"]) for r in await conn.fetch("SELECT l2_norm(centroid) AS n FROM vector_cells WHERE version = $1", version)]
        assert len(norms) == 4 and norms == pytest.approx([1.0] * 4, abs=1e-3)
        assert await vector_cells.ensure_cells(conn, 1, cells=4, sample_size=500) is None

        await conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass", vector_cells.index_name(version))
        assert await vector_cells.current(conn) is None
        rebuilt = await vector_cells.ensure_cells(conn, 1, cells=4, sample_size=500)
        assert rebuilt is not None and rebuilt != version and await vector_cells.existing(conn) == {rebuilt: True}
        assert await conn.fetchval("SELECT count(*) FROM vector_cells WHERE version = $1", version) == 0

        await conn.execute(f"DROP INDEX {vector_cells.index_name(rebuilt)}")  # centroids and function left behind
        version = await vector_cells.ensure_cells(conn, 1, cells=4, sample_size=500)
        assert version is not None and await vector_cells.existing(conn) == {version: True}
        assert await conn.fetchval("SELECT array_agg(DISTINCT version) FROM vector_cells") == [version]
    finally:
        for left in set(await vector_cells.existing(conn)) | {
            int(r["version"]) for r in await conn.fetch("SELECT DISTINCT version FROM vector_cells")
        }:
            await vector_cells.retire(conn, left, concurrently=False)


async def test_the_worker_trains_the_cells_again_as_the_store_grows(tenants: Tenants) -> None:
    """A version records the rows it was trained at. Once the table has retrain_growth times
    that, the next run builds a new version beside it (both valid: recall may still be probing
    the old one); the run after retires the old one. Below that growth, or with growth 0, a
    valid version stands."""
    conn = tenants.conn
    rng = np.random.default_rng(19)
    await _store(conn, tenants.mine, tenants.ws, [("fact", 0.5, _unit(rng.normal(size=DIM))) for _ in range(64)])
    await conn.execute("ANALYZE fragments")
    rows = await vector_cells.embedded_rows(conn)
    first = await vector_cells.ensure_cells(conn, 1, retrain_growth=2.0, cells=4, sample_size=500)
    try:
        assert first is not None and await vector_cells.trained_rows(conn, first) == rows
        assert await vector_cells.ensure_cells(conn, 1, retrain_growth=2.0, cells=4, sample_size=500) is None

        # The table has grown past twice the rows the version was trained at.
        await conn.execute("UPDATE vector_cell_versions SET trained_rows = $2 WHERE version = $1", first, rows // 2 - 1)
        assert await vector_cells.ensure_cells(conn, 1, retrain_growth=0, cells=4, sample_size=500) is None
        assert await vector_cells.ensure_cells(conn, 1, retrain_growth=3.0, cells=4, sample_size=500) is None
        second = await vector_cells.ensure_cells(conn, 1, retrain_growth=2.0, cells=4, sample_size=500)
        assert second is not None and second > first
        assert await vector_cells.existing(conn) == {first: True, second: True}
        assert await vector_cells.current(conn) == second
        assert await vector_cells.trained_rows(conn, second) == rows

        assert await vector_cells.ensure_cells(conn, 1, retrain_growth=2.0, cells=4, sample_size=500) is None
        assert await vector_cells.existing(conn) == {second: True}
        assert await conn.fetchval("SELECT array_agg(DISTINCT version) FROM vector_cells") == [second]
        assert await conn.fetchval("SELECT array_agg(version) FROM vector_cell_versions") == [second]
        assert await conn.fetchval("SELECT to_regprocedure($1)", f"{vector_cells.function_name(first)}(halfvec)") is None
    finally:
        for left in set(await vector_cells.existing(conn)) | {
            int(r["version"]) for r in await conn.fetch("SELECT DISTINCT version FROM vector_cells")
        }:
            await vector_cells.retire(conn, left, concurrently=False)
