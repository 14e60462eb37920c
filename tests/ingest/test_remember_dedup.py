"""Identical content from one key in one workspace is one active fragment: a second remember
(or batch item) answers the stored id with duplicate=true instead of storing a copy, while
another workspace or another key keeps its own; idempotencyKey works as before."""

from __future__ import annotations

from tests.ingest.helpers import db, fragment
from tests.support import call, create_api_key, mcp_session, unique

NOTE = "The billing service retries failed card charges three times, an hour apart."


async def _active(database_url: str, key_id: str) -> list[str]:
    async with db(database_url) as conn:
        rows = await conn.fetch("SELECT id FROM fragments WHERE key_id = $1 AND valid_to IS NULL ORDER BY created_at", key_id)
    return [r["id"] for r in rows]


async def test_remember_twice_stores_once_and_refreshes_the_copy(stack, mcp_url: str) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    ws = unique()
    base = {"content": NOTE, "topic": "billing", "type": "fact", "workspace": ws}
    async with mcp_session(mcp_url, raw) as s:
        first = await call(s, "remember", {**base, "importance": 0.4})
        # Whitespace and case are not a difference (the content hash normalises them).
        again = await call(s, "remember", {**base, "content": "  " + NOTE.upper(), "importance": 0.9})
    assert "duplicate" not in first
    assert again["duplicate"] is True and again["id"] == first["id"]
    # Every documented field of a stored reply is still there.
    assert again["success"] is True and again["scope"] == "permanent" and again["ttl_tier"] == first["ttl_tier"]
    assert again["keywords"] == first["keywords"] and again["conflicts"] == []
    assert await _active(stack.database_url, key_id) == [first["id"]]
    row = await fragment(stack.database_url, first["id"])
    assert row["access_count"] == 1 and abs(row["importance"] - 0.9) < 1e-6


async def test_batch_duplicates_inside_the_batch_and_against_a_remembered_one(stack, mcp_url: str) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    ws = unique()
    other = {"content": "Invoices are generated on the first business day of the month.", "topic": "billing", "type": "fact"}
    async with mcp_session(mcp_url, raw) as s:
        stored = await call(s, "remember", {"content": NOTE, "topic": "billing", "type": "fact", "workspace": ws})
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": NOTE, "topic": "billing", "type": "fact"}, other, dict(other)]})
        # And the other way round: remember after the batch stored it.
        after = await call(s, "remember", {**other, "workspace": ws})
    results = batch["results"]
    assert results[0] == {"index": 0, "success": True, "id": stored["id"], "duplicate": True}
    assert "duplicate" not in results[1] and results[2] == {"index": 2, "success": True, "id": results[1]["id"], "duplicate": True}
    assert after["duplicate"] is True and after["id"] == results[1]["id"]
    assert sorted(await _active(stack.database_url, key_id)) == sorted([stored["id"], results[1]["id"]])


async def test_other_workspace_other_key_and_session_scope_keep_their_own_copy(stack, mcp_url: str) -> None:
    alice, alice_id = await create_api_key(stack.database_url)
    bob, bob_id = await create_api_key(stack.database_url)
    ws, elsewhere = unique(), unique()
    base = {"content": NOTE, "topic": "billing", "type": "fact", "workspace": ws}
    async with mcp_session(mcp_url, alice) as s:
        mine = await call(s, "remember", base)
        moved = await call(s, "remember", {**base, "workspace": elsewhere})
        # Working memory ends with its session: a permanent copy must not collapse into it, nor it into one.
        session = await call(s, "remember", {**base, "scope": "session"})
    async with mcp_session(mcp_url, bob) as s:
        theirs = await call(s, "remember", base)
        theirs_batch = await call(s, "batch_remember", {"workspace": elsewhere, "fragments": [{"content": NOTE, "topic": "billing", "type": "fact"}]})
    for reply in (moved, session, theirs):
        assert "duplicate" not in reply and reply["id"] != mine["id"]
    assert "duplicate" not in theirs_batch["results"][0]
    assert len(await _active(stack.database_url, alice_id)) == 3
    assert sorted(await _active(stack.database_url, bob_id)) == sorted([theirs["id"], theirs_batch["results"][0]["id"]])


async def test_idempotency_key_semantics_are_unchanged_by_content_dedup(stack, mcp_url: str) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    ws = unique()
    base = {"content": NOTE, "topic": "billing", "type": "fact", "workspace": ws}
    first_key, second_key = unique("ik"), unique("ik")
    async with mcp_session(mcp_url, raw) as s:
        first = await call(s, "remember", {**base, "idempotencyKey": first_key})
        replay = await call(s, "remember", {**base, "idempotencyKey": first_key})
        # A new key with content already stored: the stored copy answers, and the key is bound to it.
        other = await call(s, "remember", {**base, "idempotencyKey": second_key})
        other_replay = await call(s, "remember", {**base, "content": "Different content, same retry key as before.", "idempotencyKey": second_key})
    assert replay == {"success": True, "id": first["id"], "idempotent": True}
    assert other["duplicate"] is True and other["id"] == first["id"]
    assert other_replay == {"success": True, "id": first["id"], "idempotent": True}
    assert await _active(stack.database_url, key_id) == [first["id"]]
