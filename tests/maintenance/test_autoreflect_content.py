"""What AutoReflect leaves behind, through real MCP sessions ending: a session's decisions,
errors, procedures and open questions, each tied to its source; nothing for a session that
only stored and searched; nothing that outranks the user's own memories; and reflections of
one session never linked as contradicting each other (issue 17, item 1)."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.maintenance.conftest import wait_for
from tests.maintenance.factories import new_key
from tests.support import call, mcp_session, unique

DECISION = "We decided to retry webhook deliveries with exponential backoff up to 6 times."
PROCEDURE = "To rotate the webhook secret: create the new one, dual-sign for an hour, drop the old."
ERROR = "Deploy failed because the migration locked the orders table."
FIX = "ran the migration CONCURRENTLY"
OPEN_ERROR = "The invoice PDF renderer crashes on right-to-left names."


async def _reflected_session(db: asyncpg.Connection, key_id: str) -> asyncpg.Record:
    """The key's MCP session, once the gateway's session end has been reflected."""
    row = await wait_for(lambda: db.fetchrow(
        "SELECT id FROM sessions WHERE key_id = $1 AND reflected_at IS NOT NULL", key_id), timeout=60)
    assert row, "the session end did not lead to a reflection"
    return row


async def _reflections(db: asyncpg.Connection, session_id: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT id, type, content FROM fragments WHERE session_id = $1 AND topic = 'session_reflect'", session_id)


async def test_a_session_that_only_stored_and_searched_leaves_no_fragment(mstack, db) -> None:
    raw, key = await new_key(mstack.database_url)
    ws = unique("ws")
    async with mcp_session(mstack.mcp_url, raw) as s:
        stored = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"Load test batch {i}: the checkout service held {100 + i} requests per second.", "topic": "load",
             "type": "fact"}
            for i in range(6)
        ]})
        assert all(r["success"] for r in stored["results"]), stored
        for _ in range(3):
            await call(s, "recall", {"text": "checkout throughput", "workspace": ws})
        await call(s, "forget", {"id": stored["results"][0]["id"]})
    session = await _reflected_session(db, key)
    # Before: "Session …#1 used recall x3, batch_remember x1, forget x1 …" (fact) and
    # "Session … ended … Tools used: …" (episode): tallies no later agent can use.
    assert await _reflections(db, session["id"]) == []
    total = await db.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1 AND valid_to IS NULL", key)
    assert total == 5  # the six stored, one forgotten, nothing added


async def _work_session(mstack: Any, raw: str, ws: str) -> dict[str, str]:
    async with mcp_session(mstack.mcp_url, raw) as s:
        ids = {}
        for name, args in (
            ("lunch", {"content": "The team lunch is on Fridays at noon in the atrium.", "topic": "office", "type": "fact"}),
            ("decision", {"content": DECISION, "topic": "webhooks", "type": "decision"}),
            ("procedure", {"content": PROCEDURE, "topic": "webhooks", "type": "procedure"}),
            ("error", {"content": ERROR, "topic": "deploy", "type": "error", "resolutionStatus": "resolved", "outcome": FIX}),
            ("open", {"content": OPEN_ERROR, "topic": "invoices", "type": "error", "resolutionStatus": "open"}),
        ):
            ids[name] = (await call(s, "remember", {**args, "workspace": ws}))["id"]
        await call(s, "recall", {"text": "webhook retries", "workspace": ws})
    return ids


async def test_reflection_holds_the_session_items_each_linked_to_its_source(mstack, db) -> None:
    raw, key = await new_key(mstack.database_url)
    ws = unique("ws")
    ids = await _work_session(mstack, raw, ws)
    session = await _reflected_session(db, key)
    rows = await _reflections(db, session["id"])
    by_content = {r["content"]: r for r in rows}
    resolved = by_content.get(f"Cause: {ERROR} -> Fix: {FIX}")
    unresolved = by_content.get(f"Unresolved: {OPEN_ERROR}")
    assert resolved is not None and resolved["type"] == "error", rows
    assert unresolved is not None and unresolved["type"] == "fact", rows
    # No tallies, no counts of what was stored.
    assert not any("Tools used" in r["content"] or "stored" in r["content"] for r in rows), rows
    # The decision and the procedure are handed over verbatim and map onto the fragments that
    # say so: each exists once.
    for content in (DECISION, PROCEDURE):
        assert await db.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1 AND content = $2", key, content) == 1
    links = {(r["from_id"], r["to_id"], r["relation_type"]) for r in await db.fetch(
        "SELECT from_id, to_id, relation_type FROM fragment_links WHERE from_id = ANY($1::text[]) OR to_id = ANY($1::text[])",
        [resolved["id"], unresolved["id"]])}
    assert (ids["error"], resolved["id"], "resolved_by") in links, links
    assert (unresolved["id"], ids["open"], "related") in links, links

    # The reflection never outranks the user's own memory for a question it does not answer.
    async with mcp_session(mstack.mcp_url, raw) as s:
        reply = await call(s, "recall", {"text": "When is the team lunch?", "workspace": ws, "fields": ["id", "topic"]})
    ranked = [f["id"] for f in reply["fragments"]]
    assert ranked and ranked[0] == ids["lunch"], reply


async def test_reflections_of_one_session_are_not_linked_as_contradicting(mstack, db) -> None:
    raw, key = await new_key(mstack.database_url, permissions=["read", "write", "admin"])
    ws = unique("ws")
    thirty = "The nightly export job for the big tenant times out after 30 minutes."
    forty_five = "The nightly export job for the big tenant times out after 45 minutes."
    async with mcp_session(mstack.mcp_url, raw) as s:
        for content in (thirty, forty_five):
            await call(s, "remember", {"content": content, "topic": "export", "type": "error",
                                       "resolutionStatus": "open", "workspace": ws})
    session = await _reflected_session(db, key)
    rows = await _reflections(db, session["id"])
    assert {r["content"] for r in rows} >= {f"Unresolved: {thirty}", f"Unresolved: {forty_five}"}, rows

    async with mcp_session(mstack.mcp_url, raw) as s:
        report = await call(s, "memory_consolidate", {"stages": ["contradictions"]})
    assert report["status"] == "succeeded", report
    contradicts = await db.fetch(
        "SELECT l.from_id, l.to_id, a.topic FROM fragment_links l JOIN fragments a ON a.id = l.from_id"
        " WHERE l.relation_type = 'contradicts' AND a.key_id = $1", key)
    # The user's two statements do conflict (the signal fires on this pair) ...
    assert any(r["topic"] == "export" for r in contradicts), contradicts
    # ... but the session's two reflections of them are one account, not a contradiction.
    reflection_ids = {r["id"] for r in rows}
    assert not [r for r in contradicts if r["from_id"] in reflection_ids and r["to_id"] in reflection_ids], contradicts
