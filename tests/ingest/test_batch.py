"""batch_remember (synchronous and async) and batch_status on the shared stack."""

from __future__ import annotations

import asyncio
import re

from tests.ingest.helpers import db, ingest_call, principal_of, rpc_error, tool_error, wait_job
from tests.support import call, create_api_key, mcp_session, unique


def _items(n: int, marker: str, start: int = 0) -> list[dict]:
    return [{"content": f"Node {marker}-{i} of the search cluster serves shard {i}.", "topic": "search", "type": "fact"}
            for i in range(start, start + n)]


async def test_per_item_validation_messages_exactly(mcp_url: str, master_key: str) -> None:
    items = [
        {"content": "A valid fragment about the cache layer.", "topic": "cache", "type": "fact"},
        {"topic": "cache", "type": "fact"},
        {"content": None, "topic": "cache", "type": "fact"},
        {"content": "x" * 4001, "topic": "cache", "type": "fact"},
        {"content": "Another valid fragment without a type.", "topic": "cache"},
        {"content": "tiny", "topic": "cache", "type": "fact"},
        {"content": "A fragment of an unknown type value.", "topic": "cache", "type": "memo"},
        {"content": "Deploy token is ghp_1234567890abcdefghijklmnopqrstuvwxyzAB for the bot.", "topic": "cache", "type": "fact"},
    ]
    async with mcp_session(mcp_url, master_key) as s:
        reply = await call(s, "batch_remember", {"fragments": items, "workspace": unique()})
    errors = [r.get("error") for r in reply["results"]]
    assert errors[:6] == [None, "content is required", "content is required", "content length 4001 exceeds max 4000",
                          "type is required", "Content too short: length < 10 and word count < 3"]
    assert errors[6].startswith("type:")
    assert "github_token" in errors[7] and "ghp_" not in errors[7]
    assert reply["inserted"] == 1 and reply["failed"] == 7 and reply["count"] == 1


async def test_limit_of_200_and_workspace_default(stack, mcp_url: str) -> None:
    raw, _ = await create_api_key(stack.database_url, default_workspace="key-home")
    ws = unique()
    async with mcp_session(mcp_url, raw) as s:
        err = await rpc_error(s, "batch_remember", {"fragments": _items(201, "big")})
        assert err.code == -32602 and "fragments" in err.message
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            *_items(2, "wsdef"), {"content": "Item with its own workspace wins over the default.", "topic": "t", "type": "fact", "workspace": "own-ws"}]})
        keyed = await call(s, "batch_remember", {"fragments": _items(1, "keydef")})
    async with db(stack.database_url) as conn:
        rows = {r["id"]: r for r in await conn.fetch("SELECT id, workspace, workspace_source FROM fragments WHERE id = ANY($1::text[])",
                                                      [r["id"] for r in reply["results"] + keyed["results"]])}
    got = [(rows[r["id"]]["workspace"], rows[r["id"]]["workspace_source"]) for r in reply["results"] + keyed["results"]]
    assert got == [(ws, "explicit"), (ws, "explicit"), ("own-ws", "explicit"), ("key-home", "key_default")]


async def test_batch_duplicates_and_item_idempotency(stack, mcp_url: str, master_key: str) -> None:
    ws = unique()
    items = _items(3, unique("dup"))
    items.append(dict(items[0]))
    keyed = [{**item, "idempotencyKey": unique("ik")} for item in _items(2, unique("idem"))]
    async with mcp_session(mcp_url, master_key) as s:
        first = await call(s, "batch_remember", {"fragments": items + keyed, "workspace": ws})
        again = await call(s, "batch_remember", {"fragments": items + keyed, "workspace": ws})
    assert first["results"][3] == {"index": 3, "success": True, "id": first["results"][0]["id"], "duplicate": True}
    assert [r["id"] for r in again["results"]] == [r["id"] for r in first["results"]]
    assert again["results"][4].get("idempotent") is True and again["results"][0].get("duplicate") is True
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE workspace = $1", ws) == 5


async def test_async_batch_is_queued_processed_and_searchable(stack, mcp_url: str, master_key: str) -> None:
    ws = unique()
    marker = unique("kiwi")
    items = _items(60, marker)
    items.insert(5, {"content": "short", "topic": "search", "type": "fact"})
    async with mcp_session(mcp_url, master_key) as s:
        reply = await call(s, "batch_remember", {"fragments": items, "workspace": ws, "async": True})
        assert set(reply) == {"async", "accepted", "rejected", "jobId", "errors"}
        assert reply["async"] is True and reply["accepted"] == 60 and reply["rejected"] == 1
        assert re.fullmatch(r"batch-\d{13}-[0-9a-f]{8}", reply["jobId"])
        assert reply["errors"] == [{"index": 5, "success": False, "error": "Content too short: length < 10 and word count < 3"}]
        status = await wait_job(s, reply["jobId"])
        assert status == {"jobId": reply["jobId"], "state": "completed", "accepted": 60, "processed": 60, "failed": 0}
        found = await call(s, "recall", {"keywords": [f"{marker}-42"], "workspace": ws, "pageSize": 5})
        assert any(f"{marker}-42 " in f["content"] for f in found["fragments"])
        # Queued again: every item is a content duplicate now, so nothing is accepted.
        dup = await call(s, "batch_remember", {"fragments": items[:3], "workspace": ws, "async": True})
        assert dup["accepted"] == 0 and dup["rejected"] == 3
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE workspace = $1", ws) == 60


async def test_batch_status_unknown_and_other_tenant(stack, mcp_url: str, master_key: str) -> None:
    owner, _ = await create_api_key(stack.database_url)
    stranger, _ = await create_api_key(stack.database_url)
    async with mcp_session(mcp_url, owner) as s:
        job = await call(s, "batch_remember", {"fragments": _items(2, unique("own")), "async": True})
        assert (await wait_job(s, job["jobId"]))["state"] == "completed"
    async with mcp_session(mcp_url, stranger) as s:
        theirs = await tool_error(s, "batch_status", {"jobId": job["jobId"]})
        missing = await tool_error(s, "batch_status", {"jobId": "batch-1-deadbeef"})
        err = await rpc_error(s, "batch_status", {})
    assert theirs == missing | {"jobId": job["jobId"]} and missing["error"] == "Job not found"
    assert err.code == -32602 and "jobId" in err.message
