"""L3's two plans (shared.repositories.vector_search): a filtered scope small next to the table
is ranked exactly, a broad one walks HNSW with the filters inside the scan. Which one runs is
read off EXPLAIN ANALYZE of the statement nearest() sends (the plan not taken is never
executed); both return only what the caller may read."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest
from pgvector.asyncpg import register_vector

from services.common.internal import ToolContext
from services.recall import search
from services.recall.effects import SideEffects
from services.recall.search import ScopeSizes
from services.recall.service import ReadResources, recall
from shared.db import SEARCH_PATH, create_pool
from shared.domain.fragment import NewFragment
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.domain.tokens import TokenCounter
from shared.embeddings import Embedder, load_embedder, tokenizer_file
from shared.repositories import fragments as fragments_repo
from shared.repositories import retrieval, type_graphs, vector_search
from shared.settings import RecallSettings
from tests.support import Stack, call, create_api_key, facts_beside_another_tenant, mcp_session, unique

# How far the exact ranking's similarities (computed from the half-precision copies) may lie
# from the float ones: at 1M the largest gap over 200 queries' top 60 was 5.7e-5.
HALF_SIMILARITY = 5e-4

DIM = 384


@pytest.fixture
async def conn(stack: Stack):  # type: ignore[no-untyped-def]
    c = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(c)
    await c.execute("SET hnsw.iterative_scan = relaxed_order; SET hnsw.ef_search = 80")
    yield c
    await c.close()


async def _broad(conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch, floor: int = 0, weight: float = 0.0) -> None:
    """Scopes past `floor` rows (and past sqrt(weight * k * table rows)) count as broad. A test
    table is so small that the planner would rank even the HNSW branch by a sort of the scope's
    rows; without sorts it takes the index order, which is what a large table gets anyway."""
    monkeypatch.setattr(vector_search, "EXACT_SCOPE_FLOOR", floor)
    monkeypatch.setattr(vector_search, "EXACT_WEIGHT", weight)
    await conn.execute("SET enable_sort = off")


async def _with_type_graphs(conn: asyncpg.Connection) -> None:
    """The type graphs of the suite's store, which is far below TYPE_GRAPH_MIN_ROWS (migration
    0032 leaves a small store without them): built for every type it holds."""
    await conn.execute("ANALYZE fragments")
    await type_graphs.ensure_type_graphs(conn, 1, concurrently=False)


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


async def _store(
    conn: asyncpg.Connection, key_id: str | None, workspace: str | None, rows: list[tuple[str, float, np.ndarray]],
    topic: str = "vectors",
) -> list[str]:
    """Fragments straight through the repository's insert: (type, importance, vector) each."""
    fragments = []
    for kind, importance, vector in rows:
        fid = f"frag-{uuid.uuid4().hex[:16]}"
        content = f"synthetic {fid}"
        fragments.append(NewFragment(
            id=fid, content=content, topic=topic, type=kind, keywords=[], importance=importance,
            content_hash=hashlib.sha256(content.encode()).hexdigest(), embedding=vector,
            key_id=key_id, workspace=workspace, workspace_source="explicit" if workspace else "unscoped",
        ))
    await fragments_repo.insert_many(conn, fragments)
    return [f.id for f in fragments]


async def _executed(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, query: np.ndarray, k: int, scope_rows: int | None = None,
) -> set[str]:
    """Which plan ran: 'exact' when the scope's rows were read and ranked, 'hnsw' when an
    HNSW graph was scanned (EXPLAIN ANALYZE: a node never executed has no loops)."""
    ran, graphs = await _ran(conn, principal, flt, query, k, scope_rows)
    return ran | ({"hnsw"} if graphs else set())


async def _ran(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, query: np.ndarray, k: int, scope_rows: int | None = None,
) -> tuple[set[str], set[str]]:
    """{'exact'} or nothing, and the names of the HNSW graphs the statement walked."""
    sql, values = vector_search.nearest_statement(principal, flt, query, k, scope_rows)
    plan = (await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))
    ran: set[str] = set()
    graphs: set[str] = set()

    def walk(node: dict[str, Any], cte: str | None) -> None:
        name = node.get("Subplan Name", "")
        cte = name.removeprefix("CTE ") if name.startswith("CTE ") else cte
        if node.get("Actual Loops", 0) > 0:
            if node.get("Index Name", "").startswith("fragments_embedding_hnsw"):
                graphs.add(node["Index Name"])
            if cte == "exact" and node.get("Relation Name") == "fragments":
                ran.add("exact")
        for child in node.get("Plans", []):
            walk(child, cte)

    walk(json.loads(plan)[0]["Plan"], None)
    return ran, graphs


class Tenants:
    """Two tenants in one workspace: the caller's rows and another key's rows right beside them."""

    def __init__(self, conn: asyncpg.Connection, mine: str, theirs: str, ws: str) -> None:
        self.conn, self.mine, self.theirs, self.ws = conn, mine, theirs, ws
        self.principal = Principal(key_id=mine, visible_key_ids=(mine,))


@pytest.fixture
async def tenants(stack: Stack, conn: asyncpg.Connection) -> Tenants:
    _, mine = await create_api_key(stack.database_url)
    _, theirs = await create_api_key(stack.database_url)
    return Tenants(conn, mine, theirs, unique())


async def _scene(t: Tenants, seed: int) -> tuple[np.ndarray, dict[str, tuple[str, float, np.ndarray]], list[str]]:
    """12 facts and 4 decisions of the caller in the workspace, 3 of its global facts, and the
    other tenant's copies of the query vector in the workspace and globally (what isolation
    must keep out). Returns (query, the caller's rows by id, the other tenant's ids)."""
    rng = np.random.default_rng(seed)
    query = _unit(rng.normal(size=DIM))
    near = [_unit(query + rng.normal(scale=s, size=DIM)) for s in np.linspace(0.02, 0.12, 19)]
    rng.shuffle(near)  # type: ignore[arg-type]
    facts = [("fact", round(0.3 + 0.05 * i, 2), near[i]) for i in range(12)]
    decisions = [("decision", 0.9, near[12 + i]) for i in range(4)]
    global_facts = [("fact", 0.8, near[16 + i]) for i in range(3)]
    rows: dict[str, tuple[str, float, np.ndarray]] = {}
    for ws, batch in ((t.ws, facts + decisions), (None, global_facts)):
        rows.update(zip(await _store(t.conn, t.mine, ws, batch), batch, strict=True))
    foreign = await _store(t.conn, t.theirs, t.ws, [("fact", 0.9, query)])
    foreign += await _store(t.conn, t.theirs, None, [("fact", 0.9, query)])
    return query, rows, foreign


async def _scope_reads(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, query: np.ndarray, k: int) -> list[dict[str, Any]]:
    """The executed scans of fragments inside the exact ranking, as plan nodes: under the
    exact CTE, where the scope is inlined."""
    sql, values = vector_search.nearest_statement(principal, flt, query, k)
    plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))[0]["Plan"]
    reads: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], cte: str | None) -> None:
        name = node.get("Subplan Name", "")
        cte = name.removeprefix("CTE ") if name.startswith("CTE ") else cte
        if cte == "exact" and node.get("Relation Name") == "fragments" and node.get("Actual Loops", 0) > 0:
            reads.append(node)
        for child in node.get("Plans", []):
            walk(child, cte)

    walk(plan, None)
    return reads


def _brute_force(
    query: np.ndarray, rows: dict[str, tuple[str, float, np.ndarray]], kind: str, floor: float, k: int
) -> list[tuple[str, float]]:
    scored = [(fid, float(np.dot(query, v))) for fid, (t, imp, v) in rows.items() if t == kind and imp >= floor]
    return sorted(scored, key=lambda x: -x[1])[:k]


async def test_a_selective_scope_is_ranked_exactly(tenants: Tenants) -> None:
    query, rows, foreign = await _scene(tenants, seed=1)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.5)
    got = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 5)

    assert await _executed(tenants.conn, tenants.principal, flt, query, 5) == {"exact"}
    want = _brute_force(query, rows, "fact", 0.5, 5)  # the workspace's facts >= 0.5 and the global ones
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=HALF_SIMILARITY)
    assert not set(foreign) & {i for i, _ in got}


async def test_a_broad_scope_walks_the_index_and_still_fills_k(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nearer rows the filters exclude (4 decisions, 2 facts below 0.4, the other tenant's
    two copies of the query itself) would take a post-filtered top 8 down to a few rows; with
    the filters inside the scan 8 eligible rows come back, each with its true similarity, best
    first. Which 8 of the 13 eligible come back is the graph's recall, not this code's: the 19
    random-direction rows sit in a graph of the suite's MiniLM embeddings, nearly orthogonal
    to all of them, and clean-clone runs found 6 of the true 8 (at ef_search 80 and at 400)
    and once missed even the clear best, so no particular row is pinned."""
    query, rows, foreign = await _scene(tenants, seed=2)
    await _broad(tenants.conn, monkeypatch)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.4)
    got = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 8)

    assert await _executed(tenants.conn, tenants.principal, flt, query, 8) == {"hnsw"}
    assert len(got) == 8  # the filters inside the scan: selective or not, k rows come back
    assert {i for i, _ in got} <= {i for i, (t, imp, _) in rows.items() if t == "fact" and imp >= 0.4}
    assert all(sim == pytest.approx(float(np.dot(query, rows[i][2])), abs=HALF_SIMILARITY) for i, sim in got)
    sims = [s for _, s in got]
    assert sims == sorted(sims, reverse=True)
    assert not set(foreign) & {i for i, _ in got}


async def test_the_scope_is_counted_per_tenant_with_its_global_rows(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan turns on the scope's size: the caller's 12 workspace facts plus its 3 global
    ones are 15 rows (the other tenant's rows beside them count for nothing), so 15 is still
    ranked exactly and 14 is not."""
    query, rows, foreign = await _scene(tenants, seed=3)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",))
    await _broad(tenants.conn, monkeypatch, floor=15)
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4) == {"exact"}
    exact = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 4)
    monkeypatch.setattr(vector_search, "EXACT_SCOPE_FLOOR", 14)
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4) == {"hnsw"}
    graph = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 4)

    assert [i for i, _ in exact] == [i for i, _ in _brute_force(query, rows, "fact", 0.0, 4)]
    # which 4 the graph finds is its recall (see the broad-scope test); that they are the
    # caller's facts, 4 of them, is the filter's
    assert len(graph) == 4
    assert {i for i, _ in graph} <= {i for i, (t, _, _) in rows.items() if t == "fact"}
    assert not set(foreign) & {i for i, _ in exact + graph}


async def test_a_count_taken_beforehand_decides_the_plan_in_place_of_the_statement_s_own(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recall counts the vector layer's scope while the model embeds the query
    (vector_search.scope_rows) and hands the count to nearest(): the same 15 rows the statement
    counts (the caller's 12 workspace facts and 3 global ones, not the other tenant's), and
    the plan follows the count it is given."""
    query, rows, _ = await _scene(tenants, seed=9)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",))
    await _broad(tenants.conn, monkeypatch, floor=15)
    counted = await vector_search.scope_rows(tenants.conn, tenants.principal, flt, 4)
    assert counted == 15
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4, counted) == {"exact"}
    got = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 4, counted)
    assert got == await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 4)
    assert [i for i, _ in got] == [i for i, _ in _brute_force(query, rows, "fact", 0.0, 4)]
    # One row more than the floor in the count given, and the statement walks the graph
    # without counting again.
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4, counted + 1) == {"hnsw"}
    # The master key without a workspace has no scope to count: always the graph.
    assert await vector_search.scope_rows(tenants.conn, Principal.master(), FragmentFilter(types=("fact",)), 4) is None


class _Counting:
    """vector_search.scope_floors, with the importance floor of each read it takes recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.floors: list[float | None] = []
        self.real = vector_search.scope_floors
        monkeypatch.setattr(vector_search, "scope_floors", self)
        self.started = threading.Event()

    async def __call__(
        self, conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, limit: int, cells: int | None = None,
    ) -> vector_search.ScopeFloors | None:
        self.floors.append(flt.min_importance)
        self.started.set()
        return await self.real(conn, principal, flt, limit, cells)


class _HeldUntilCounted:
    """The query model, its runs held until a scope count has started: recall counts a scope
    while the model runs (search._semantic), so a model quicker than cells() never skips it."""

    def __init__(self, model: Embedder, counting: _Counting) -> None:
        self.model, self.counting = model, counting
        self.dimensions, self.parallel_calls = model.dimensions, model.parallel_calls

    def embed(self, texts: list[str]) -> np.ndarray:
        self.counting.started.wait(timeout=10)  # never set: the vector goes on, and the floors assert fails
        return self.model.embed(texts)


async def test_a_read_of_a_scope_answers_its_floor_and_the_floors_above_it(
    stack: Stack, tenants: Tenants, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ScopeSizes reads a scope's importances (vector_search.scope_floors). A read answers its
    floor and every floor above it with the count scope_size gives; a range of one tenant and one
    type is read best first, so past the cap it still answers the floors above its last row's
    importance, and it is read from the top: one read answers every floor. Below a read past the
    cap the plan is fixed. Only a floor no read answers, or another tenant's scope, is read
    again. Every answer is a fresh count's, or past the cap as the fresh count is, and picks the
    plan a fresh count would."""
    query, _, _ = await _scene(tenants, seed=10)
    await _broad(tenants.conn, monkeypatch, floor=10)  # the cap: 10 rows
    counting = _Counting(monkeypatch)
    sizes = ScopeSizes()
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)

    async def rows(floor: float, principal: Principal = tenants.principal, types: tuple[str, ...] = ("fact",)) -> int | None:
        flt = FragmentFilter(workspace=tenants.ws, types=types, min_importance=floor)
        got = await sizes.rows(pool, principal, flt, 4)
        counted = await vector_search.scope_size(tenants.conn, principal, flt, 4)
        assert got is not None and counted is not None
        fresh, cap = counted
        assert got == fresh or (got > cap and fresh > cap), (floor, types, got, fresh)
        plan = await _executed(tenants.conn, principal, flt, query, 4, got)
        assert plan == await _executed(tenants.conn, principal, flt, query, 4, fresh)
        return got

    try:
        # The workspace's facts at 0.30-0.85 (step 0.05), its decisions at 0.9, 3 global facts at 0.8.
        # The workspace's range is read best first, so from the top: 11 rows (the cap + 1, 0.85
        # down to 0.35) and the 3 global facts, and every floor is answered by that one read.
        assert await rows(0.6) == 6 + 3  # read
        assert await rows(0.7) == 4 + 3  # answered, the count at 0.7
        assert await rows(0.85) == 1
        assert await rows(0.0) == 11 + 3  # at or below 0.35: past the cap (a range is read to the cap + 1)
        assert await rows(0.1) == 14
        assert await rows(0.45) == 9 + 3  # above 0.35: the count
        assert await rows(0.6, Principal(key_id=tenants.theirs, visible_key_ids=(tenants.theirs,))) == 2  # another tenant: its own read
        assert counting.floors == [None, None]

        # Two types are read in the index's order, not by importance: past the cap, a read
        # answers only the floors below it.
        both = ("fact", "decision")
        assert await rows(0.3, types=both) == 11 + 3
        assert await rows(0.2, types=both) == 14  # below a read past the cap: answered
        assert await rows(0.5, types=both) == 14  # above it: read (8 facts and 4 decisions are past the cap)
        assert await rows(0.8, types=both) == 2 + 4 + 3  # read, within the cap
        assert await rows(0.85, types=both) == 1 + 4  # above that: answered
        assert await rows(0.25, types=both) == 14  # the earlier reads are kept: below those past the cap, answered
        assert counting.floors[2:] == [0.3, 0.5, 0.8]

        for floor in random.Random(10).sample([round(0.05 * i, 2) for i in range(21)], 21):
            await rows(floor)
            await rows(floor, types=both)
        # A scope with nothing to count is not counted at all.
        read = len(counting.floors)
        assert await sizes.rows(pool, Principal.master(), FragmentFilter(types=("fact",)), 4) is None
        assert len(counting.floors) == read
    finally:
        await pool.close()


async def test_a_read_from_the_top_that_does_not_tell_is_followed_by_one_at_the_floor(
    stack: Stack, tenants: Tenants, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scope whose workspace range is read best first is read from the top; its global rows are
    read in the index's order, so past the cap that read tells no floor above it, and the scope
    is read again at the query's floor (both reads kept)."""
    ws = unique()
    rng = np.random.default_rng(14)
    await _store(tenants.conn, tenants.mine, ws, [("fact", 0.7, _unit(rng.normal(size=DIM)))] * 2)
    await _store(tenants.conn, tenants.mine, None, [("fact", round(0.3 + 0.05 * i, 2), _unit(rng.normal(size=DIM))) for i in range(12)])
    await _broad(tenants.conn, monkeypatch, floor=10)  # the cap: 10 rows
    counting = _Counting(monkeypatch)
    sizes = ScopeSizes()
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)

    async def rows(floor: float) -> int | None:
        flt = FragmentFilter(workspace=ws, types=("fact",), min_importance=floor)
        got = await sizes.rows(pool, tenants.principal, flt, 4)
        counted = await vector_search.scope_size(tenants.conn, tenants.principal, flt, 4)
        assert counted is not None and got == counted[0], (floor, got, counted)
        return got

    try:
        assert await rows(0.6) == 2 + 6  # the global facts at 0.6-0.85
        assert counting.floors == [None, 0.6]  # from the top: 11 global rows of 12, in the index's order
        assert await rows(0.7) == 2 + 4  # above the read at 0.6 (within the cap): answered
        assert await rows(0.0) == 2 + 11  # below it: read at its floor, not from the top again
        assert counting.floors == [None, 0.6, 0.0]
    finally:
        await pool.close()


async def test_a_read_of_one_type_reads_its_ranges_best_first_from_the_index(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scope of one tenant and one type is read down its workspace's range of an index led by
    (key_id, workspace, type, importance) in importance order, index-only, stopping at the cap + 1
    rows: neither the whole range read nor a sort of it. Its global rows are one index range too."""
    await _scene(tenants, seed=12)
    await tenants.conn.execute("VACUUM (ANALYZE) fragments")
    await _broad(tenants.conn, monkeypatch, floor=10)
    await tenants.conn.execute("RESET enable_sort")  # a sort must lose on its own
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.0)
    sql, values, ordered = vector_search.scope_floors_statement(tenants.principal, flt, 4)
    assert ordered == [True, False]  # the workspace's range, and its global rows' in the index's order
    plan = json.loads(await tenants.conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))[0]["Plan"]
    scans: list[tuple[str, dict[str, Any]]] = []  # (the parent's node type, the scan)

    def walk(node: dict[str, Any]) -> None:
        for child in node.get("Plans", []):
            if child.get("Relation Name") == "fragments":
                scans.append((node["Node Type"], child))
            walk(child)

    walk(plan)
    # Either index led by (key_id, workspace, type, importance): at a few rows the planner ties them.
    led = {"fragments_key_ws_type_importance", "fragments_scope_vectors"}
    assert [(p, n["Node Type"]) for p, n in scans] == [("Limit", "Index Only Scan")] * 2
    assert {n["Index Name"] for _, n in scans} <= led
    assert scans[0][1]["Scan Direction"] == "Backward"  # best first, the Limit right above it: no sort between
    assert [n["Actual Rows"] for _, n in scans] == [11, 3]  # 12 facts in the workspace: stopped at 11

    # The master key reads its own rows (no key) in a workspace best first too, by the index's
    # columns backwards: `key_id IS NULL` gives the planner no order by importance alone. Every
    # key's rows are one range of several keys, in the index's order.
    ws = unique()
    rng = np.random.default_rng(12)
    await _store(tenants.conn, None, ws, [("fact", round(0.3 + 0.05 * i, 2), _unit(rng.normal(size=DIM))) for i in range(12)])
    await _store(tenants.conn, tenants.mine, ws, [("fact", 0.9, _unit(rng.normal(size=DIM)))])
    await tenants.conn.execute("VACUUM (ANALYZE) fragments")
    master = FragmentFilter(workspace=ws, types=("fact",), min_importance=0.0)
    sql, values, ordered = vector_search.scope_floors_statement(Principal.master(), master, 4)
    assert ordered == [True, False, False, False]  # (no key, the workspace), (no key, global), (keys, ...) x 2
    plan = json.loads(await tenants.conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))[0]["Plan"]
    scans.clear()
    walk(plan)
    first, node = scans[0]
    assert (first, node["Node Type"], node["Index Name"] in led) == ("Limit", "Index Only Scan", True)
    assert node["Scan Direction"] == "Backward"
    assert node["Actual Rows"] == 11  # the master's 12 facts in the workspace: stopped at the cap + 1
    floors = await vector_search.scope_floors(tenants.conn, Principal.master(), master, 4)
    assert floors is not None
    read = [({round(importance, 2): n for importance, n in counts.items()}, best) for counts, best in floors.ranges[:3]]
    assert read[0] == ({round(0.85 - 0.05 * i, 2): 1 for i in range(11)}, True)  # 0.85 down to 0.35
    assert read[2] == ({0.9: 1}, False)  # the tenant's fact in the workspace, in the keys' range
    # Past the cap, the range read best first still answers a floor above its last row (0.6 to
    # 0.85). (The keys' global range holds every test's global facts: it may be past the cap.)
    assert vector_search.ScopeFloors(floors.floor, floors.bound, floors.ranges[:1]).rows(0.6) == 6


async def test_what_a_scope_count_decided_expires(stack: Stack, tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    await _scene(tenants, seed=11)
    monkeypatch.setattr(search, "SCOPE_SIZE_TTL_S", 0.05)
    counting = _Counting(monkeypatch)
    sizes = ScopeSizes()
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.5)
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    try:
        assert await sizes.rows(pool, tenants.principal, flt, 4) == await sizes.rows(pool, tenants.principal, flt, 4) == 8 + 3
        assert len(counting.floors) == 1
        await asyncio.sleep(0.2)  # past the TTL, not a timing: the entry is gone after it whatever the machine
        assert await sizes.rows(pool, tenants.principal, flt, 4) == 11
        assert len(counting.floors) == 2
    finally:
        await pool.close()


async def test_recall_keeps_its_scope_counts_across_searches(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recall service hands its ScopeSizes to every search: a second filtered recall of the
    scope at a higher floor is planned without counting it again."""
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "remember", {"content": "The billing service deploys from the release branch.", "topic": "deploys",
                                   "type": "fact", "workspace": ws, "importance": 0.7})
    counting = _Counting(monkeypatch)
    pool = await create_pool(stack.database_url, min_size=2, max_size=2, server_settings=vector_search.graph_settings(40))
    try:
        model = _HeldUntilCounted(load_embedder(latency=True), counting)
        res = ReadResources(pool=pool, embedder=model, tokens=TokenCounter(tokenizer_file()), settings=RecallSettings(),
                            effects=SideEffects(pool, None, replica="test"))
        ctx = ToolContext(principal=Principal(key_id=key_id, visible_key_ids=(key_id,)))
        for text, floor in (("which branch does billing deploy from", 0.2), ("billing release branch", 0.5)):
            reply, _ = await recall(res, ctx, {"text": text, "workspace": ws, "type": "fact", "minImportance": floor})
            assert "release branch" in reply["fragments"][0]["content"]
    finally:
        await pool.close()
    assert counting.floors == [None]  # one read, from the top (the range is read best first)


async def test_the_exact_share_grows_with_the_table(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a floor, a scope is ranked exactly while its size squared stays within
    EXACT_WEIGHT * k * the table's rows (pg_class): the same 15-row scope is exact against
    a weight that allows it and walks HNSW against one that does not."""
    query, _, _ = await _scene(tenants, seed=4)
    # The whole table's walk: a fact graph (another test's) would set the cap by its own rows.
    await tenants.conn.execute("DROP INDEX IF EXISTS fragments_embedding_hnsw_fact")
    await tenants.conn.execute("ANALYZE fragments")
    table = max(await tenants.conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments'::regclass"), 1.0)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",))
    await _broad(tenants.conn, monkeypatch, weight=16.0**2 / (4 * table))  # cap sqrt(w * 4 * N) = 16
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4) == {"exact"}
    monkeypatch.setattr(vector_search, "EXACT_WEIGHT", 13.0**2 / (4 * table))  # cap 13
    assert await _executed(tenants.conn, tenants.principal, flt, query, 4) == {"hnsw"}


async def test_superseded_rows_stay_out_of_both_plans(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    query, rows, _ = await _scene(tenants, seed=5)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",))
    best = _brute_force(query, rows, "fact", 0.0, 1)[0][0]
    await tenants.conn.execute("UPDATE fragments SET valid_to = now() WHERE id = $1", best)
    exact = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 3)
    await _broad(tenants.conn, monkeypatch)
    graph = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 3)
    assert best not in {i for i, _ in exact + graph}
    assert len(exact) == len(graph) == 3


async def test_exact_and_graph_plans_agree_and_stay_in_scope(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through the write path with the model's embeddings: what a tenant stored over
    MCP, ranked by both plans, in the same order, without the other tenant's copy."""
    texts = [
        "The nightly backup of the orders database runs at 02:00 UTC.",
        "Backups of Postgres are copied to a second region every night.",
        "The design review for the checkout page is on Thursday.",
        "Redis evictions spiked after the cache TTL was lowered.",
        "Restore drills from last night's database backup take forty minutes.",
    ]
    ws = unique()
    key_id, mine, theirs = await facts_beside_another_tenant(stack.mcp_url, stack.database_url, ws, texts)

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    query = load_embedder().embed(["when is the database backed up?"])[0]
    # facts only: closing the sessions writes an AutoReflect episode into the workspace too
    flt = FragmentFilter(workspace=ws, types=("fact",))
    exact = await vector_search.nearest(conn, principal, flt, query, 4)
    await _broad(conn, monkeypatch)
    graph = await vector_search.nearest(conn, principal, flt, query, 4)

    # The same rows with the same similarities, each list best first. Position by position
    # only up to ties: two of these facts can land within float rounding of each other, and
    # then either order is right (a clean-clone run saw ranks 3 and 4 swap between plans).
    assert {i for i, _ in exact} == {i for i, _ in graph}
    by_id = dict(graph)
    assert all(by_id[i] == pytest.approx(sim, abs=HALF_SIMILARITY) for i, sim in exact)
    assert theirs not in {i for i, _ in exact}
    assert {i for i, _ in exact} <= set(mine)
    assert exact[0][0] in (mine[0], mine[1], mine[4])
    for ranked in (exact, graph):
        sims = [sim for _, sim in ranked]
        assert sims == sorted(sims, reverse=True)


async def test_a_broad_scope_of_one_type_walks_that_type_s_graph(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the exact cap, a scope that names one type walks the graph of that type's rows only
    (migration 0028: a few times fewer tuples visited before k pass); a scope of two types walks
    the whole table's graph. All keep every filter and fill k.

    The planner picks the type's graph by its cost, which is lower the smaller the type's share
    of the table. The suite's shared store is mostly facts: with 5,000 facts and 4 decisions the
    fact graph's walk was costed 18,542 against the whole graph's 18,560, a tie that a fresh
    ANALYZE's sample can turn (it did in one clean-clone run). So the fact scope is held to a
    graph walk, either one; the decision scope, a small share of any store here, to its own."""
    query, rows, foreign = await _scene(tenants, seed=9)
    await _with_type_graphs(tenants.conn)
    await _broad(tenants.conn, monkeypatch)
    for types, graph in ((("fact",), {"fragments_embedding_hnsw_fact", "fragments_embedding_hnsw"}),
                         (("decision",), {"fragments_embedding_hnsw_decision"}),
                         (("fact", "decision"), {"fragments_embedding_hnsw"})):
        flt = FragmentFilter(workspace=tenants.ws, types=types, min_importance=0.4)
        ran, graphs = await _ran(tenants.conn, tenants.principal, flt, query, 4)
        got = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 4)

        assert ran == set() and len(graphs) == 1 and graphs <= graph, (types, graphs)
        assert len(got) == 4
        assert {i for i, _ in got} <= {i for i, (t, imp, _) in rows.items() if t in types and imp >= 0.4}
        assert not set(foreign) & {i for i, _ in got}


async def test_the_cap_is_set_by_the_rows_of_the_graph_the_walk_would_take(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk visits about k * G / s tuples of a graph of G rows, so a scope of one type whose
    graph is built is capped by that graph's rows, not the table's: at 1M, scopes of a type
    without a graph walked the whole table's at 73-637 ms p50 where ranking them exactly took
    9-28 (bench/README.md, session 30). The same 4-row scope is exact under the table's cap,
    walks its type's graph under the graph's, and is exact again when that graph is invalid
    (a build that did not finish, which the planner does not walk)."""
    query, rows, _ = await _scene(tenants, seed=13)
    conn = tenants.conn
    await _with_type_graphs(conn)
    flt = FragmentFilter(workspace=tenants.ws, types=("decision",))
    scope = sum(1 for kind, _, _ in rows.values() if kind == "decision")
    table = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments'::regclass")
    graph = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments_embedding_hnsw_decision'::regclass")
    assert scope == 4 and 0 < graph < table / 2
    # The table's cap just past the scope, so the graph's is below it.
    await _broad(conn, monkeypatch, weight=(scope + 0.5) ** 2 / (4 * table))
    cap_sql = f"SELECT {vector_search._exact_cap(4)}"
    assert await conn.fetchval(cap_sql) >= scope
    assert await _ran(conn, tenants.principal, flt, query, 4) == (set(), {"fragments_embedding_hnsw_decision"})
    await conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'fragments_embedding_hnsw_decision'::regclass")
    try:
        assert await _executed(conn, tenants.principal, flt, query, 4) == {"exact"}
    finally:
        await conn.execute("UPDATE pg_index SET indisvalid = true WHERE indexrelid = 'fragments_embedding_hnsw_decision'::regclass")


async def test_a_pooled_connection_keeps_walking_the_graph_after_its_first_release(
    stack: Stack, tenants: Tenants, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool resets every connection it takes back (RESET ALL). The graph settings are the
    connection's startup values, so the reset returns to them: on a later acquisition the
    iterative scan still fills k from a scope the graph's first ef_search candidates mostly
    miss. Set once by a `SET` on a new connection (as recall did until session 18) they were
    gone after the first release, and this scope came back with a handful of rows."""
    query, rows, _ = await _scene(tenants, seed=10)
    await _with_type_graphs(tenants.conn)
    await _broad(tenants.conn, monkeypatch)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.4)
    pool = await create_pool(stack.database_url, min_size=1, max_size=1, server_settings=vector_search.graph_settings(57))
    try:
        for _ in range(3):
            async with pool.acquire() as own:
                await own.execute("SET enable_sort = off")
                got = await vector_search.nearest(own, tenants.principal, flt, query, 8)
                ran, graphs = await _ran(own, tenants.principal, flt, query, 8)

                settings = (await own.fetchval("SHOW hnsw.iterative_scan"), await own.fetchval("SHOW hnsw.ef_search"))
                assert settings == ("relaxed_order", "57")
                assert graphs and not ran
                assert len(got) == 8
                assert {i for i, _ in got} <= {i for i, (t, imp, _) in rows.items() if t == "fact" and imp >= 0.4}
    finally:
        await pool.close()


async def _graphs(conn: asyncpg.Connection) -> dict[str, str]:
    return {r["indexname"]: r["indexdef"] for r in await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'fragments'"
        " AND indexdef ILIKE '%USING hnsw%'"
    )}


async def test_a_type_gets_its_graph_once_it_has_the_rows(tenants: Tenants) -> None:
    """Migration 0032 and the maintenance worker's type_graphs task: a type's own graph is
    built (concurrently) once the statistics give the type TYPE_GRAPH_MIN_ROWS rows, one per
    type fragments_type_check allows, with the whole graph's operator class; an interrupted
    build's invalid index is built again; the migration drops the graphs of a store whose
    types are all below 100,000 rows, as the suite's is."""
    conn = tenants.conn
    await _scene(tenants, seed=12)  # facts and decisions at least
    await conn.execute("ANALYZE fragments")
    held = await type_graphs.estimated_rows(conn)
    check = await conn.fetchval("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'fragments_type_check'")
    # the types the worker builds graphs for are those the table allows
    assert set(type_graphs.FRAGMENT_TYPES) == set(re.findall(r"'(\w+)'::text", check))
    assert {"fact", "decision", "episode"} <= set(type_graphs.FRAGMENT_TYPES) and held["fact"] > 0 and held["decision"] > 0

    migration = Path(__file__).resolve().parents[2] / "shared" / "schema" / "migrations" / "0032_type_graphs_when_they_pay.sql"
    await conn.execute(migration.read_text())
    assert set(await _graphs(conn)) == {"fragments_embedding_hnsw"}  # every type below 100k rows

    assert await type_graphs.ensure_type_graphs(conn, 10**9) == []  # none has that many
    assert set(await _graphs(conn)) == {"fragments_embedding_hnsw"}

    built = await type_graphs.ensure_type_graphs(conn, 1)
    have = {t for t, n in held.items() if n >= 1}
    assert set(built) == have
    graphs = await _graphs(conn)
    assert set(graphs) == {"fragments_embedding_hnsw"} | {f"fragments_embedding_hnsw_{t}" for t in have}
    for t in have:
        definition = graphs[f"fragments_embedding_hnsw_{t}"]
        assert "(embedding halfvec_cosine_ops)" in definition
        assert definition.endswith(f"WHERE (type = '{t}'::text)"), definition
    assert await type_graphs.existing(conn) == dict.fromkeys(have, True)
    assert await type_graphs.ensure_type_graphs(conn, 1) == []  # nothing left to build

    # A concurrent build that did not finish leaves its index invalid: it is built again.
    await conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'fragments_embedding_hnsw_fact'::regclass")
    assert (await type_graphs.existing(conn))["fact"] is False
    assert await type_graphs.ensure_type_graphs(conn, 1) == ["fact"]
    assert (await type_graphs.existing(conn))["fact"] is True


async def test_the_exact_scope_is_read_from_the_index_not_the_heap(tenants: Tenants) -> None:
    """The exact ranking reads each (tenant, workspace) range of fragments_scope_vectors
    index-only: the rows' embeddings come from the index, not one heap page per row. Written
    as one OR of the workspace and its global rows, the scope would be a bitmap heap scan."""
    query, rows, _ = await _scene(tenants, seed=6)
    # The visibility map the planner costs an index-only scan by. Whether VACUUM can mark these
    # pages all-visible depends on the suite's other open transactions (a clean-clone run
    # fetched all 13 rows from the heap), so the heap fetches are not asserted; the plan is.
    await tenants.conn.execute("VACUUM (ANALYZE) fragments")
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.4)
    # A new tenant's 13 rows are estimated at a row or two, and at that the narrower index on the
    # same columns plus a heap read or two costs about the same (it won after test_vector_cells'
    # scenes, with every page all-visible). Which statement shape allows the index-only read is
    # the subject, not that tie: the narrower index is dropped for this plan, and put back.
    undo = tenants.conn.transaction()
    await undo.start()
    try:
        await tenants.conn.execute("DROP INDEX fragments_key_ws_type_importance")
        reads = await _scope_reads(tenants.conn, tenants.principal, flt, query, 5)
    finally:
        await undo.rollback()

    assert reads, "the exact ranking ran"
    assert {(n["Node Type"], n.get("Index Name")) for n in reads} == {("Index Only Scan", "fragments_scope_vectors")}
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) == len(_brute_force(query, rows, "fact", 0.4, 99))
    got = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 5)
    assert [i for i, _ in got] == [i for i, _ in _brute_force(query, rows, "fact", 0.4, 5)]


async def test_the_master_key_ranks_every_tenants_scope_exactly(tenants: Tenants, monkeypatch: pytest.MonkeyPatch) -> None:
    """The master key's scope is written as its own rows (no key) and every key's rows (one
    array of api_keys' ids): together they are every row of the workspace and every global
    row, whoever stored them, and each row once."""
    query, rows, foreign = await _scene(tenants, seed=7)
    topic = unique()
    own = [("fact", 0.7, _unit(query + np.random.default_rng(8).normal(scale=0.05, size=DIM)))]
    rows.update(zip(await _store(tenants.conn, None, tenants.ws, own, topic=topic), own, strict=True))
    await tenants.conn.execute(
        "UPDATE fragments SET topic = $1 WHERE id = ANY($2::text[])", topic, [*rows, *foreign]
    )
    rows.update({fid: ("fact", 0.9, query) for fid in foreign})  # the other tenant's copies of the query
    # The topic keeps the suite's other global rows out of the answer; the scope count does not
    # read topics, so the floor keeps every scope exact.
    monkeypatch.setattr(vector_search, "EXACT_SCOPE_FLOOR", 10**9)
    flt = FragmentFilter(workspace=tenants.ws, types=("fact",), topic=topic)
    got = await vector_search.nearest(tenants.conn, Principal.master(), flt, query, 20)

    assert await _executed(tenants.conn, Principal.master(), flt, query, 20) == {"exact"}
    want = _brute_force(query, rows, "fact", 0.0, 20)
    assert len(want) == 12 + 3 + 2 + 1  # the caller's facts, its global ones, the other tenant's two, the master's own
    assert sorted(i for i, _ in got) == sorted(i for i, _ in want)
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=HALF_SIMILARITY)


async def test_nearest_is_planned_for_its_parameters_every_time(tenants: Tenants) -> None:
    """asyncpg prepares the statement; after five runs Postgres may keep one generic plan for
    every scope (at 1M, p95 77 -> 535-589 ms). nearest() has each run planned for its own
    parameters, even on a connection that asks for generic plans."""
    query, _, _ = await _scene(tenants, seed=7)
    await tenants.conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        flt = FragmentFilter(workspace=tenants.ws, types=("fact",), min_importance=0.4)
        for _ in range(8):
            assert len(await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 5)) == 5
        plans = await tenants.conn.fetchrow(
            "SELECT sum(generic_plans) AS generic, sum(custom_plans) AS custom FROM pg_prepared_statements"
            " WHERE btrim(statement, E' \\n') LIKE 'WITH t AS MATERIALIZED%'"
        )
    finally:
        await tenants.conn.execute("RESET plan_cache_mode")
    assert plans["generic"] == 0 and plans["custom"] >= 8, dict(plans)


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))


def _half(x: np.ndarray) -> np.ndarray:
    """A vector as halfvec stores it (float16), back in float32."""
    return x.astype(np.float16).astype(np.float32)


def _half_flip(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A query and two vectors a, b where a is nearer in float and b in half precision (each
    cosine computed from the vectors rounded to float16, as halfvec's is)."""
    rng = np.random.default_rng(seed)
    cos, half = _cos, _half

    for _ in range(100_000):
        query = _unit(rng.normal(size=DIM))
        a = _unit(query + rng.normal(scale=0.3, size=DIM))
        b = _unit(a + rng.normal(scale=0.002, size=DIM))
        float_gap = cos(query, a) - cos(query, b)
        half_gap = cos(half(query), half(b)) - cos(half(query), half(a))
        if float_gap > 2e-6 and half_gap > 2e-6:
            return query, a, b
    raise AssertionError("no pair found whose order half precision flips")


async def test_the_exact_ranking_and_the_pool_read_the_stored_half_vectors(tenants: Tenants) -> None:
    """A fragment's embedding is stored in half precision only (migration 0034): a pair whose
    order half precision flips comes back from the exact ranking in half order, each similarity
    within HALF_SIMILARITY of the float one, and pool_rows' cosines, by which recall ranks its
    pool, are the same half vectors' (the two layers can no longer disagree on the order)."""
    query, a, b = _half_flip(seed=11)
    ws = unique()
    id_a, id_b = await _store(tenants.conn, tenants.mine, ws, [("fact", 0.5, a), ("fact", 0.5, b)])
    floats = {id_a: float(np.dot(query, a)), id_b: float(np.dot(query, b))}
    assert floats[id_a] > floats[id_b]  # in float, a is nearer

    flt = FragmentFilter(workspace=ws)
    assert await _executed(tenants.conn, tenants.principal, flt, query, 2) == {"exact"}
    both = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 2)
    assert [i for i, _ in both] == [id_b, id_a]
    assert [s for _, s in both] == pytest.approx([floats[id_b], floats[id_a]], abs=HALF_SIMILARITY)
    one = await vector_search.nearest(tenants.conn, tenants.principal, flt, query, 1)
    assert [i for i, _ in one] == [id_b]

    halves = {id_a: _cos(_half(query), _half(a)), id_b: _cos(_half(query), _half(b))}
    pooled = await retrieval.pool_rows(tenants.conn, tenants.principal, [id_a, id_b], [], query)
    assert {i: r.cosine for i, r in pooled.items()} == pytest.approx(halves, abs=1e-6)
    assert pooled[id_b].cosine > pooled[id_a].cosine
    assert await tenants.conn.fetchval(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'fragments'::regclass AND attname = 'embedding'") == "halfvec(384)"
    assert await tenants.conn.fetchval(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'fragments'::regclass AND attname = 'embedding_half'") == 0


def test_reads_best_first_says_what_the_read_does() -> None:
    """ScopeSizes reads from the top when vector_search.reads_best_first: exactly the scopes whose
    read (scope_floors_statement) has a range read best first."""
    principals = [Principal.master(), Principal(key_id="k1", visible_key_ids=("k1",)), Principal(key_id="k1", visible_key_ids=("k1", "k2"))]
    seen = set()
    for principal in principals:
        for workspace in (None, "ws"):
            for types in (None, ("fact",), ("fact", "error")):
                flt = FragmentFilter(workspace=workspace, types=types, min_importance=0.5)
                _, _, ordered = vector_search.scope_floors_statement(principal, flt, 4)
                assert vector_search.reads_best_first(principal, flt) == any(ordered), (principal, flt)
                seen.add(any(ordered))
    assert seen == {True, False}
