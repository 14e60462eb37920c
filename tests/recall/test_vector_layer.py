"""L3's two plans: a small filtered scope is ranked exactly, a large one through HNSW with the
filters inside the scan. Both must return the same fragments in the same order, and only
what the caller may read."""

from __future__ import annotations

import asyncpg
import pytest
from pgvector.asyncpg import register_vector

from shared.db import SEARCH_PATH
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.embeddings import load_embedder
from shared.repositories import retrieval
from tests.support import Stack, facts_beside_another_tenant, unique

TEXTS = [
    "The nightly backup of the orders database runs at 02:00 UTC.",
    "Backups of Postgres are copied to a second region every night.",
    "The design review for the checkout page is on Thursday.",
    "Redis evictions spiked after the cache TTL was lowered.",
    "Restore drills from last night's database backup take forty minutes.",
]


@pytest.fixture
async def conn(stack: Stack):  # type: ignore[no-untyped-def]
    c = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(c)
    await c.execute("SET hnsw.iterative_scan = relaxed_order")
    yield c
    await c.close()


async def test_exact_and_graph_plans_agree_and_stay_in_scope(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = unique()
    key_id, mine, theirs = await facts_beside_another_tenant(stack.mcp_url, stack.database_url, ws, TEXTS)

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    query = load_embedder().embed(["when is the database backed up?"])[0]
    # facts only: closing the sessions writes an AutoReflect episode into the workspace too
    flt = FragmentFilter(workspace=ws, types=("fact",))
    exact = await retrieval.nearest(conn, principal, flt, query, 4)
    monkeypatch.setattr(retrieval, "EXACT_SCOPE", 0)  # every scope takes the HNSW plan
    graph = await retrieval.nearest(conn, principal, flt, query, 4)

    assert [i for i, _ in exact] == [i for i, _ in graph]
    assert [round(sim, 5) for _, sim in exact] == [round(sim, 5) for _, sim in graph]
    assert theirs not in {i for i, _ in exact}
    assert {i for i, _ in exact} <= set(mine)
    assert exact[0][0] in (mine[0], mine[1], mine[4])
    sims = [sim for _, sim in exact]
    assert sims == sorted(sims, reverse=True)


async def test_lexical_layer_scopes_postings_to_the_workspace_plus_global(stack: Stack, conn: asyncpg.Connection) -> None:
    """L2 reads the postings with "this workspace or global" as one index condition (global
    postings spell the workspace ''): a global fragment is a lexical candidate under any
    workspace filter, another workspace's never, another tenant's never; document
    frequencies count the same scope."""
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    ws, elsewhere = unique(), unique()
    term = f"zephyrine{unique().replace('-', '')[-8:]}"
    async with mcp_session(stack.mcp_url, key) as s:
        inside = await call(s, "remember", {"content": f"The {term} cluster runs in this workspace.", "topic": "ops", "type": "fact", "workspace": ws})
        glob = await call(s, "remember", {"content": f"Every team shares the {term} runbook.", "topic": "ops", "type": "fact"})
        away = await call(s, "remember", {"content": f"The {term} mirror runs somewhere else.", "topic": "ops", "type": "fact", "workspace": elsewhere})
    async with mcp_session(stack.mcp_url, other) as s:
        foreign = await call(s, "remember", {"content": f"Another tenant's {term} notes.", "topic": "ops", "type": "fact"})
    assert await conn.fetchval("SELECT workspace FROM fragment_terms WHERE fragment_id = $1 LIMIT 1", glob["id"]) == ""

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    flt = FragmentFilter(workspace=ws)
    terms = await retrieval.query_terms(conn, term, [])
    dfs = await retrieval.document_frequencies(conn, principal, flt, terms)
    assert dfs[term] == 2  # this workspace's and the global one
    stats = retrieval.term_stats(dfs, 10)
    found, _ = await retrieval.bm25_candidates(conn, principal, flt, stats, dfs, 10)
    assert {i for i, _ in found} == {inside["id"], glob["id"]}
    assert not {away["id"], foreign["id"]} & {i for i, _ in found}
    # Unscoped: every workspace of the tenant, still not the other tenant.
    everywhere, _ = await retrieval.bm25_candidates(conn, principal, FragmentFilter(), stats, dfs, 10)
    assert {i for i, _ in everywhere} == {inside["id"], glob["id"], away["id"]}
