"""Session consolidate (reference 004) removes a raw memory that a consolidated one already
says through forget, which takes a connection of its own. Holding its own meanwhile, the
call waited forever on a one-connection pool, and DB_POOL_MAX concurrent consolidations with
duplicates did on any pool (bench/README.md, session 29)."""

from __future__ import annotations

import asyncio

import asyncpg

from services.common.internal import ToolContext
from services.ingest.mnemory_api import session_consolidate
from services.ingest.service import WriteResources
from shared.db import SEARCH_PATH, create_pool
from shared.domain.principal import Principal
from shared.embeddings import load_embedder
from tests.mnemory_api.helpers import add, api, set_layer
from tests.support import Stack, unique

# A hang detector, not a timing: the old code never returned.
DEADLINE_S = 120.0


async def test_consolidate_removes_a_duplicate_on_a_one_connection_pool(stack: Stack) -> None:
    async with api(stack.gateway_url, stack.master_key) as c:
        kept = await add(c, f"The staging cluster runs in eu-west-1 ({unique('k')}).")
        twin = await add(c, f"The staging cluster runs in eu-central-1 ({unique('t')}).")
        other = await add(c, f"Backups are kept for thirty days ({unique('o')}).")
    session_id = unique("ses")
    db = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        # `twin` says what `kept` says (its content hash), raw in a session of the master key.
        await db.execute("UPDATE fragments SET content_hash = (SELECT content_hash FROM fragments WHERE id = $1) WHERE id = $2",
                         kept, twin)
        await db.execute("INSERT INTO mnemory_session_summaries (key_id, session_id, memory_ids) VALUES (NULL, $1, $2)",
                         session_id, [twin, other])
    finally:
        await db.close()
    await set_layer(stack.database_url, twin, "raw")
    await set_layer(stack.database_url, other, "raw")

    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    try:
        res = WriteResources(pool=pool, embedder=load_embedder())
        result, is_error = await asyncio.wait_for(
            session_consolidate(res, res.job_buffer(), ToolContext(principal=Principal.master()), {"session_id": session_id}),
            DEADLINE_S,
        )
    finally:
        await pool.close()
    assert not is_error, result
    assert result["merged"] == 1 and result["consolidated_memory_ids"] == [other] and result["status"] == "consolidated"
    async with api(stack.gateway_url, stack.master_key) as c:
        left = (await c.post("/api/memories/by-ids", json={"ids": [kept, twin, other]})).json()["results"]
        assert sorted(m["id"] for m in left) == sorted([kept, other])
        assert (await c.get(f"/api/sessions/{session_id}")).json()["consolidation_state"] == "consolidated"
