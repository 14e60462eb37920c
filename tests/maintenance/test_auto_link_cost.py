"""Auto-link's exact scope costs one read of the scope and one matrix product (issue 22 item 2).

The link job of every batch compares each new fragment with every live fragment of its
workspace. Postgres computing those cosines row by row in a per-fragment scan was the job's
whole cost (0.17 ms of backend CPU a LoCoMo turn); the scope is now read once and compared
in numpy. The queries the job sends say which it does; the links it makes are the ones
Postgres's own cosine ordering gives (here, and through HNSW in test_auto_link_plans.py)."""

from __future__ import annotations

import asyncio

import asyncpg
import numpy as np

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


async def test_an_exact_scope_is_read_once_and_compared_outside_postgres(stack: Stack) -> None:
    key_id, ids, _ = await facts_beside_another_tenant(stack.mcp_url, stack.database_url, unique(), TEXTS)
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    sent: list[str] = []
    try:
        for _ in range(100):  # the worker's own link job for these first
            if await conn.fetchval("SELECT count(*) FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", ids) == 0:
                break
            await asyncio.sleep(0.1)
        await conn.execute("DELETE FROM fragment_links WHERE relation_type = 'related' AND from_id = ANY($1::text[])", ids)
        await conn.execute("INSERT INTO fragment_link_pending (fragment_id) SELECT unnest($1::text[])", ids)
        # Postgres's own nearest rows of each fragment, to compare the job's links with.
        expected = set()
        for fragment_id in ids:
            for row in await conn.fetch(
                """SELECT f.id, 1 - (f.embedding <=> s.embedding) AS sim FROM fragments f, fragments s
                   WHERE s.id = $1 AND f.id <> s.id AND f.key_id = $2 AND f.workspace = s.workspace AND f.valid_to IS NULL
                   ORDER BY f.embedding <=> s.embedding LIMIT $3""",
                fragment_id, key_id, links_repo.AUTO_LINK_NEIGHBOURS,
            ):
                if row["sim"] >= links_repo.AUTO_LINK_MIN_SIMILARITY:
                    expected.add((fragment_id, row["id"]))
        conn.add_query_logger(lambda record: sent.append(record.query))
        async with conn.transaction():
            made = await links_repo.auto_link(conn, ids)
        links = {(r["from_id"], r["to_id"]) for r in await conn.fetch(
            "SELECT from_id, to_id FROM fragment_links WHERE relation_type = 'related' AND from_id = ANY($1::text[])", ids)}
    finally:
        await conn.close()

    assert made == len(links) and links == expected and {(ids[0], ids[1]), (ids[0], ids[2])} <= links
    job = [q for q in sent if "fragment" in q]
    assert not any("<=>" in q for q in job), job  # no cosine computed by Postgres
    assert sum("vector_send(f.embedding)" in q for q in job) == 1, job  # the scope read once


def test_nearest_links_are_the_top_neighbours_above_the_threshold() -> None:
    rng = np.random.default_rng(7)
    scope = rng.normal(size=(50, 16)).astype(np.float32)
    scope[1] = scope[0] + 0.01  # near-duplicates of row 0
    scope[2] = scope[0] - 0.01
    scope[4] = scope[3] * 3.0  # a twin of row 3: its float32 cosine may round past 1
    scope_ids = [f"f{i}" for i in range(50)]
    links = links_repo.nearest_links(["f0", "new"], scope[[0, 3]], scope_ids, scope, 3, 0.75)
    unit = scope / np.linalg.norm(scope, axis=1, keepdims=True)
    for source, row in (("f0", 0), ("new", 3)):
        sims = unit @ unit[row]
        if source == "f0":
            sims[0] = -np.inf  # never itself
        top = [scope_ids[i] for i in np.argsort(-sims)[:3] if sims[i] >= 0.75]
        assert [t for f, t, _ in links if f == source] == top
    assert {"f1", "f2"} <= {t for f, t, _ in links if f == "f0"}
    # fragment_links.weight is checked to lie in [0, 1], as pgvector's clamped cosine does.
    assert all(0.75 <= w <= 1.0 for _, _, w in links) and ("new", "f4") in {(f, t) for f, t, _ in links}
