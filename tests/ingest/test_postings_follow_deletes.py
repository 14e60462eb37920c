"""A fragment's postings (fragment_terms, recall's inverted index) go with it: they are
kept by fragments' own triggers, deletes and TRUNCATE included (migration 0031; no foreign
key checks each posting any more)."""

from __future__ import annotations

from tests.ingest.helpers import db
from tests.support import call, create_api_key, mcp_session, unique


async def _postings(database_url: str, ids: list[str]) -> dict[str, int]:
    async with db(database_url) as conn:
        rows = await conn.fetch(
            "SELECT fragment_id, count(*) AS n FROM fragment_terms WHERE fragment_id = ANY($1::text[]) GROUP BY 1", ids
        )
    return {r["fragment_id"]: int(r["n"]) for r in rows}


async def test_forget_takes_the_postings_one_row_and_many(stack, mcp_url: str) -> None:  # type: ignore[no-untyped-def]
    key, _ = await create_api_key(stack.database_url)
    ws, topic = unique(), unique("purge")
    async with mcp_session(mcp_url, key) as s:
        stored = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"Posting probe {i}: the nightly vacuum of the {word} table runs at two.", "topic": topic, "type": "fact"}
            for i, word in enumerate(("orders", "invoices", "carts"))
        ]})
        ids = [r["id"] for r in stored["results"]]
        assert set(await _postings(stack.database_url, ids)) == set(ids)  # every fragment has postings
        await call(s, "forget", {"id": ids[0], "force": True})
        left = await _postings(stack.database_url, ids)
        assert ids[0] not in left and set(left) == set(ids[1:])  # one row: only its postings
        await call(s, "forget", {"topic": topic, "force": True})
    assert await _postings(stack.database_url, ids) == {}  # a statement deleting many


async def test_truncate_of_fragments_empties_the_postings(stack, mcp_url: str, master_key: str) -> None:  # type: ignore[no-untyped-def]
    """Inside a transaction that is rolled back, so the suite's store is left as it was."""
    async with mcp_session(mcp_url, master_key) as s:
        await call(s, "remember", {"content": "Truncate probe: the postings table empties with fragments.",
                                   "topic": unique("truncate"), "type": "fact", "workspace": unique()})
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragment_terms") > 0
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("SET LOCAL lock_timeout = '10s'")
            await conn.execute("TRUNCATE fragments CASCADE")
            assert await conn.fetchval("SELECT count(*) FROM fragment_terms") == 0
        finally:
            await tx.rollback()
        assert await conn.fetchval("SELECT count(*) FROM fragment_terms") > 0
