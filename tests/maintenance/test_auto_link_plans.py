"""Auto-link's two plans: a small (owner, workspace) scope is compared exactly, a large one
through HNSW with the scope inside the scan. Both must create the same links, and only
inside the owner's workspace."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from pgvector.asyncpg import register_vector

from shared.db import SEARCH_PATH
from shared.repositories import links as links_repo
from tests.support import Stack, facts_beside_another_tenant, unique

TEXTS = [
    "The nightly backup of the orders database runs at 02:00 UTC.",
    "Nightly backups of the orders database run at 2 am UTC.",
    "The orders database is backed up every night at 02:00 UTC.",
    "The design review for the checkout page is on Thursday.",
    "Checkout page design review happens Thursday.",
]


async def _links(conn: asyncpg.Connection, ids: list[str]) -> set[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT from_id, to_id FROM fragment_links WHERE relation_type = 'related' AND from_id = ANY($1::text[])", ids
    )
    return {(r["from_id"], r["to_id"]) for r in rows}


async def _reset(conn: asyncpg.Connection, ids: list[str]) -> None:
    await conn.execute("DELETE FROM fragment_links WHERE relation_type = 'related' AND from_id = ANY($1::text[])", ids)
    await conn.execute("INSERT INTO fragment_link_pending (fragment_id) SELECT unnest($1::text[])", ids)


async def test_exact_and_graph_plans_link_alike_within_the_scope(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = unique()
    _, ids, _ = await facts_beside_another_tenant(stack.mcp_url, stack.database_url, ws, TEXTS)

    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(conn)
    try:
        for _ in range(100):  # let the worker's own link job for these finish first
            if await conn.fetchval("SELECT count(*) FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", ids) == 0:
                break
            await asyncio.sleep(0.1)
        await _reset(conn, ids)
        await links_repo.auto_link(conn, ids)
        exact = await _links(conn, ids)
        await _reset(conn, ids)
        monkeypatch.setattr(links_repo, "EXACT_SCOPE", 0)  # every scope takes the HNSW plan
        await links_repo.auto_link(conn, ids)
        graph = await _links(conn, ids)
    finally:
        await conn.close()

    assert exact == graph
    assert {(ids[0], ids[1]), (ids[0], ids[2])} <= exact  # the backup statements find each other
    assert all(to in ids for _, to in exact)  # never the other key's copy, never outside ws
