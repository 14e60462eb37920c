"""_meta on recall: searchEventId persisted, each hint by its condition, the suggestion rules
in order, serverTime; the L1 cache never serves a forgotten or amended fragment."""

from __future__ import annotations

import asyncio
import re

import asyncpg
import pytest

from shared.db import SEARCH_PATH
from tests.support import Stack, call, create_api_key, mcp_session, unique


@pytest.fixture
async def db(stack: Stack):  # type: ignore[no-untyped-def]
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    yield conn
    await conn.close()


async def _eventually(predicate, attempts: int = 100):  # type: ignore[no-untyped-def]
    for _ in range(attempts):
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    return await predicate()


async def test_server_time_and_persisted_search_event(stack: Stack, mcp_url: str, db: asyncpg.Connection) -> None:
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        stored = await call(s, "remember", {"content": "Grafana dashboards live in the observability folder.", "topic": "grafana", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"text": "where are the grafana dashboards", "workspace": ws})
    meta = found["_meta"]
    assert set(meta["serverTime"]) == {"iso", "epoch_ms", "display_kst", "timezone"}
    assert meta["serverTime"]["timezone"] == "Asia/Seoul" and meta["serverTime"]["iso"].endswith("Z")
    assert re.fullmatch(r"\d{4}년 \d{1,2}월 \d{1,2}일 \([월화수목금토일]\) \d\d:\d\d", meta["serverTime"]["display_kst"])
    event_id = meta["searchEventId"]
    row = await _eventually(lambda: db.fetchrow("SELECT * FROM search_events WHERE id = $1 AND query_type <> 'pending'", event_id))
    assert row["key_id"] == key_id and stored["id"] in row["result_ids"] and row["search_path"] == found["searchPath"]
    # access side effects land too, off the hot path
    assert await _eventually(lambda: db.fetchval("SELECT access_count > 0 AND last_accessed_at IS NOT NULL FROM fragments WHERE id = $1", stored["id"]))


async def test_no_results_topic_mismatch_and_empty_suggestion(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with mcp_session(mcp_url, key) as s:
        empty = await call(s, "recall", {"keywords": ["anything"]})
        assert [h["signal"] for h in empty["_meta"]["hints"]] == ["no_results"]
        assert empty["_meta"]["suggestion"]["code"] == "empty_result_no_context"
        assert empty["_meta"]["suggestion"]["recommendedArgs"] == {"contextText": "현재 작업 맥락 요약"}
        with_context = await call(s, "recall", {"keywords": ["anything"], "topic": "nothing-here", "contextText": "planning a release"})
        assert "suggestion" not in with_context["_meta"]
        await call(s, "remember", {"content": "The deployment pipeline runs on GitHub Actions runners.", "topic": "deployment-pipeline", "type": "fact"})
        miss = await call(s, "recall", {"text": "runners", "topic": "deployment"})
        signals = {h["signal"]: h for h in miss["_meta"]["hints"]}
        assert miss["count"] == 0 and "no_results" in signals
        assert signals["topic_mismatch"]["args"] == {"topic": "deployment-pipeline"}


async def test_contradiction_active_error_and_stale_hints(stack: Stack, mcp_url: str, db: asyncpg.Connection) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with mcp_session(mcp_url, key) as s:
        a = await call(s, "remember", {"content": "The API rate limit is 100 requests per minute per client.", "topic": "api", "type": "fact"})
        b = await call(s, "remember", {"content": "The API rate limit is 500 requests per minute per client.", "topic": "api", "type": "fact"})
        await call(s, "link", {"fromId": a["id"], "toId": b["id"], "relationType": "contradicts"})
        found = await call(s, "recall", {"text": "api rate limit per client", "topic": "api"})
        assert "contradiction_pending" in {h["signal"] for h in found["_meta"]["hints"]}
        err = await call(s, "remember", {"content": "Image uploads fail with a 413 from the ingress.", "topic": "uploads", "type": "error"})
        found = await call(s, "recall", {"text": "image uploads fail 413", "topic": "uploads"})
        active = {h["signal"]: h for h in found["_meta"]["hints"]}["active_errors"]
        assert err["id"] in active["fragmentIds"]
        old = await call(s, "remember", {"content": "The office wifi password rotates every quarter.", "topic": "office", "type": "fact"})
        fresh = await call(s, "recall", {"text": "office wifi password", "topic": "office"})
        assert "stale_results" not in {h["signal"] for h in fresh["_meta"]["hints"]}
        await db.execute("UPDATE fragments SET created_at = now() - interval '200 days', last_accessed_at = NULL, updated_at = now() WHERE id = $1", old["id"])
        # the access side effect of the first recall may still be on its way: let it land, then age again
        await asyncio.sleep(1.5)
        await db.execute("UPDATE fragments SET last_accessed_at = NULL, updated_at = now() WHERE id = $1", old["id"])
        stale = await call(s, "recall", {"text": "office wifi password", "topic": "office", "pageSize": 1})
        assert "stale_results" in {h["signal"] for h in stale["_meta"]["hints"]}


async def test_suggestion_rules_in_order(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    kw = unique("kw")
    async with mcp_session(mcp_url, key) as s:
        await call(s, "remember", {"content": f"The {kw} service owns the invoice PDFs.", "topic": "invoices", "type": "fact", "caseId": "case-inv"})
        codes = []
        for _ in range(3):
            codes.append((await call(s, "recall", {"keywords": [kw]}))["_meta"].get("suggestion", {}).get("code"))
        assert codes[:2] == [None, None] and codes[2] == "repeat_query"
        assert (await call(s, "recall", {"keywords": [kw]}))["_meta"]["suggestion"]["recommendedTool"] == "reconstruct_history"
        await call(s, "batch_remember", {"fragments": [
            {"content": f"Noise fragment number {i} about nothing in particular at all.", "topic": "noise", "type": "fact"} for i in range(101)
        ]})
        noisy = await call(s, "recall", {"text": "invoice pdf owner"})
        assert noisy["_meta"]["suggestion"]["code"] == "no_type_filter_noisy"
        assert "suggestion" not in (await call(s, "recall", {"text": "invoice pdf owner", "type": "fact"}))["_meta"]


async def test_cache_never_serves_forgotten_or_amended(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    marker = unique("cachetest")
    async with mcp_session(mcp_url, key) as s:
        a = await call(s, "remember", {"content": f"The {marker} job exports metrics hourly.", "topic": "jobs", "type": "fact", "workspace": ws})
        b = await call(s, "remember", {"content": f"The {marker} job was written in Go.", "topic": "jobs", "type": "fact", "workspace": ws})
        q = {"keywords": [marker], "workspace": ws}
        first = await call(s, "recall", q)
        again = await call(s, "recall", q)
        assert again["searchPath"].startswith("L1")
        assert {f["id"] for f in again["fragments"]} == {f["id"] for f in first["fragments"]} == {a["id"], b["id"]}
        await call(s, "forget", {"id": a["id"]})
        after_forget = await call(s, "recall", q)
        assert a["id"] not in {f["id"] for f in after_forget["fragments"]}
        await call(s, "amend", {"id": b["id"], "content": f"The {marker} job was rewritten in Rust."})
        after_amend = await call(s, "recall", q)
        assert [f["content"] for f in after_amend["fragments"] if f["id"] == b["id"]] == [f"The {marker} job was rewritten in Rust."]
