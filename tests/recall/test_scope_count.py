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


@pytest.fixture
async def scope(stack: Stack) -> tuple[asyncpg.Connection, Principal, FragmentFilter]:
    """12 facts of a fresh key in a fresh workspace."""
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    _, key_id = await create_api_key(stack.database_url)
    ws = unique()
    contents = [f"scope count row {uuid.uuid4().hex}" for _ in range(12)]
    await fragments_repo.insert_many(conn, [
        NewFragment(id=f"frag-{uuid.uuid4().hex[:16]}", content=c, topic="counting", type="fact", keywords=[],
                    importance=0.5, content_hash=hashlib.sha256(c.encode()).hexdigest(), embedding=None,
                    key_id=key_id, workspace=ws, workspace_source="explicit")
        for c in contents
    ])
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
