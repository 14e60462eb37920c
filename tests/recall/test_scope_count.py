"""A scope's size (BM25's N, the noisy-scope hint) is counted exactly up to
retrieval.SCOPE_COUNT_CAP rows and estimated by the planner above it: at 1M an exact count of
a large scope took seconds (shared.repositories.retrieval, SCOPE_COUNT_CAP)."""

from __future__ import annotations

import hashlib
import json
import uuid

import asyncpg
import pytest

from shared.db import SEARCH_PATH
from shared.domain.fragment import NewFragment
from shared.domain.principal import Principal, SqlParams
from shared.domain.search import FragmentFilter
from shared.repositories import fragments as fragments_repo
from shared.repositories import retrieval
from shared.repositories.fragments import filter_clauses
from tests.support import Stack, create_api_key, unique


async def _facts(conn: asyncpg.Connection, key_id: str | None, workspace: str | None, count: int) -> None:
    """`count` facts of the key in the workspace (None: global rows), without embeddings."""
    contents = [f"scope count row {uuid.uuid4().hex}" for _ in range(count)]
    await fragments_repo.insert_many(conn, [
        NewFragment(id=f"frag-{uuid.uuid4().hex[:16]}", content=c, topic="counting", type="fact", keywords=[],
                    importance=0.5, content_hash=hashlib.sha256(c.encode()).hexdigest(), embedding=None,
                    key_id=key_id, workspace=workspace, workspace_source="explicit" if workspace else "unscoped")
        for c in contents
    ])


@pytest.fixture
async def scope(stack: Stack) -> tuple[asyncpg.Connection, Principal, FragmentFilter]:
    """12 facts of a fresh key in a fresh workspace."""
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    _, key_id = await create_api_key(stack.database_url)
    ws = unique()
    await _facts(conn, key_id, ws, 12)
    yield conn, Principal(key_id=key_id, visible_key_ids=(key_id,)), FragmentFilter(workspace=ws)
    await conn.close()


async def _planner_rows(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter) -> int:
    params = SqlParams()
    sql = f"EXPLAIN (FORMAT JSON) SELECT 1 FROM fragments f WHERE {' AND '.join(filter_clauses(principal, flt, params))}"
    return int(json.loads(await (await conn.prepare(sql)).fetchval(*params.values))[0]["Plan"]["Plan Rows"])


async def test_a_scope_below_the_cap_is_counted_exactly(scope, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    conn, principal, flt = scope
    monkeypatch.setattr(retrieval, "SCOPE_COUNT_CAP", 13)
    assert await retrieval.count_in_scope(conn, principal, flt) == retrieval.ScopeCount(12, exact=True)
    other = Principal(key_id="key-of-nobody", visible_key_ids=("key-of-nobody",))
    assert await retrieval.count_in_scope(conn, other, flt) == retrieval.ScopeCount(0, exact=True)


async def test_a_scope_at_the_cap_is_the_planners_estimate(scope, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """At the cap the count stops and the planner's estimate of the same scope stands in (on the
    suite's table it said 6 of these 12 rows in one run; the exact count says 12); eight runs in a row, past the
    five after which Postgres may plan a cached statement generic, all agree."""
    conn, principal, flt = scope
    monkeypatch.setattr(retrieval, "SCOPE_COUNT_CAP", 5)
    await conn.execute("ANALYZE fragments")
    estimate = await _planner_rows(conn, principal, flt)
    want = retrieval.ScopeCount(max(5, estimate), exact=False)
    got = [await retrieval.count_in_scope(conn, principal, flt) for _ in range(8)]
    assert got == [want] * 8


def _scans(node: dict) -> list[dict]:  # type: ignore[type-arg]
    """Every plan node under `node` (itself included) that read rows of fragments."""
    own = [node] if node.get("Relation Name") == "fragments" else []
    return own + [s for child in node.get("Plans", []) for s in _scans(child)]


def _global_only(node: dict) -> bool:  # type: ignore[type-arg]
    """A scan whose condition is the global rows' range alone (not the workspace's)."""
    cond = node.get("Index Cond", "") + node.get("Recheck Cond", "")
    return "workspace IS NULL" in cond and "workspace = " not in cond


async def test_the_count_reads_index_ranges(scope, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The scope is counted over disjoint index ranges, for a key and for the master key (every
    tenant's rows of the workspace and every global row): each range an index condition,
    every row counted once. Written as one OR of the workspace and its global rows, the OR is
    a filter over all of a tenant's rows, or a bitmap heap scan, which at 1M read 10k heap
    pages a count (retrieval.count_statement)."""
    conn, principal, flt = scope
    monkeypatch.setattr(retrieval, "SCOPE_COUNT_CAP", 10**9)  # every global row of the suite's table, counted
    await _facts(conn, principal.key_id, None, 3)  # the key's global rows
    # As in test_filtered_vector: the visibility map is what the planner costs an index-only
    # scan by; heap fetches depend on the suite's open transactions and are not asserted.
    await conn.execute("VACUUM (ANALYZE) fragments")
    # Which plan the planner picks on the suite's small, busy table is its call: a sequential
    # scan, or the narrow scope index and the heap where VACUUM could not set the visibility
    # map (the suite's other open transactions decide that). At 1M, vacuumed, it takes the
    # covering index's index-only scans by itself (EXPLAIN, bench/README.md session 21). With
    # sequential and bitmap scans off, what is checked is that each range is an index
    # condition, not a filter over more rows: the OR form is a filter over a tenant's rows.
    await conn.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
    for who in (principal, Principal.master()):
        params = SqlParams()
        every = f"SELECT count(*) FROM fragments f WHERE {' AND '.join(filter_clauses(who, flt, params))}"
        want = int(await conn.fetchval(every, *params.values))
        sql, values = retrieval.count_statement(who, flt)
        plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *values))[0]["Plan"]
        reads = [n for n in _scans(plan) if n.get("Actual Rows", 0) > 0]
        workspace_reads = [n for n in reads if not _global_only(n)]

        assert {n["Node Type"] for n in reads} <= {"Index Only Scan", "Index Scan"}
        assert workspace_reads and all("workspace = " in n.get("Index Cond", "") for n in workspace_reads)
        assert sum(n["Actual Rows"] for n in workspace_reads) == 12
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) == want >= 15
        assert await retrieval.count_in_scope(conn, who, flt) == retrieval.ScopeCount(want, exact=True)
    await conn.execute("RESET enable_seqscan; RESET enable_bitmapscan")
