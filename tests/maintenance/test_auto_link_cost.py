"""Auto-link's exact plan pays one cosine per compared row (issue 22 item 2, session 11).

The link job of every batch compares each new fragment with every live fragment of its
workspace; with the similarity in the select list and the distance in ORDER BY, Postgres
computed both, two cosines a row. The plan on real Postgres says which it does."""

from __future__ import annotations

import asyncpg

from shared.db import SEARCH_PATH
from shared.repositories import links as links_repo
from tests.support import Stack, facts_beside_another_tenant, unique

TEXTS = [
    "The nightly backup of the orders database runs at 02:00 UTC.",
    "Nightly backups of the orders database run at 2 am UTC.",
    "The design review for the checkout page is on Thursday.",
]


async def test_the_exact_plan_computes_one_distance_per_compared_row(stack: Stack) -> None:
    key_id, ids, _ = await facts_beside_another_tenant(stack.mcp_url, stack.database_url, unique(), TEXTS)
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        workspace = await conn.fetchval("SELECT workspace FROM fragments WHERE id = $1", ids[0])
        params: list[object] = [ids, links_repo.AUTO_LINK_NEIGHBOURS, links_repo.AUTO_LINK_MIN_SIMILARITY, key_id]
        owner = links_repo._owner_clause("f", key_id, workspace, params)
        plan = [r[0] for r in await conn.fetch(
            "EXPLAIN (VERBOSE, COSTS OFF) " + links_repo.link_statement(owner), *params)]
    finally:
        await conn.close()

    # The exact plan: the scope's rows (the materialized CTE near) projected with their
    # distance, sorted, the first few kept. Every row carried through it is computed once.
    scan = next(i for i, line in enumerate(plan) if "CTE Scan on near c" in line)
    limit = max(i for i, line in enumerate(plan[:scan]) if line.strip().startswith("->  Limit"))
    outputs = [line for line in plan[limit:scan] if line.strip().startswith("Output:")]
    assert any("<=>" in line for line in outputs), "\n".join(plan)
    assert all(line.count("<=>") <= 1 for line in outputs), "\n".join(plan)
