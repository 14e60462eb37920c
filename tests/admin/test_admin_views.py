"""The admin REST views of issue 18 (stats, activity, memory, sessions, key default_mode),
through HTTP against the real stack; master key only."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.wire import db
from tests.support import Stack, call, create_api_key, mcp_session, unique

ADMIN = "/v1/internal/model/nothing"
DATA_ROUTES = [
    ("GET", "/stats"), ("GET", "/activity"), ("GET", "/memory/overview"), ("GET", "/memory/search-events?days=3"),
    ("GET", "/memory/fragments"), ("GET", "/memory/graph?topic=x&limit=10"), ("GET", "/memory/fragments/frag-x"),
    ("DELETE", "/memory/fragments/frag-x"), ("PATCH", "/memory/fragments/frag-x"), ("GET", "/sessions"),
    ("GET", "/sessions/s-x"), ("DELETE", "/sessions/s-x"), ("POST", "/sessions/cleanup"), ("GET", "/logs/files"),
    ("GET", "/logs/read?file=gateway.log"), ("GET", "/logs/stats"), ("POST", "/maintenance/consolidation"),
    ("GET", "/export/page"), ("PUT", "/keys/k-x"),
]


def admin(stack: Stack, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack.gateway_url + ADMIN, headers={"Authorization": f"Bearer {key or stack.master_key}"}, timeout=60
    )


async def get(stack: Stack, path: str, **params: Any) -> Any:
    async with admin(stack) as http:
        response = await http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def store(key: str, mcp_url: str, ws: str, topic: str, texts: list[str], type_: str = "fact") -> list[str]:
    async with mcp_session(mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": t, "topic": topic, "type": type_} for t in texts]})
    return [r["id"] for r in reply["results"]]


async def test_data_routes_need_the_master_key(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url, permissions=["read", "write", "admin"])
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, timeout=30) as http:
        for method, path in DATA_ROUTES:
            assert (await http.request(method, path)).status_code == 401, path
            wrong = await http.request(method, path, headers={"Authorization": "Bearer not-the-master-key"})
            assert wrong.status_code == 401, path
            # an API key, even with admin permission, is not the master key (as the other admin routes)
            assert (await http.request(method, path, headers={"Authorization": f"Bearer {raw}"})).status_code == 403, path


async def test_fragments_filters_pages_and_keeps_tenants_apart(stack: Stack) -> None:
    topic, ws = unique("topic"), unique("ws")
    key_a, id_a = await create_api_key(stack.database_url)
    key_b, id_b = await create_api_key(stack.database_url)
    ids_a = await store(key_a, stack.mcp_url, ws, topic, [f"Tenant A fact number {i} about the billing cluster." for i in range(5)])
    ids_b = await store(key_b, stack.mcp_url, ws, topic, ["Tenant B keeps its own fact about the billing cluster."], "decision")

    everyone = await get(stack, "/memory/fragments", topic=topic)
    assert everyone["total"] == 6 and {i["id"] for i in everyone["items"]} == {*ids_a, *ids_b}
    only_a = await get(stack, "/memory/fragments", topic=topic, key_id=id_a, limit=2, page=1)
    assert only_a["total"] == 5 and len(only_a["items"]) == 2 and only_a["limit"] == 2
    page3 = await get(stack, "/memory/fragments", topic=topic, key_id=id_a, limit=2, page=3)
    assert [i["id"] for i in page3["items"]] == [ids_a[0]]  # newest first: the first stored is last
    seen = {i["id"] for p in (1, 2, 3) for i in (await get(stack, "/memory/fragments", topic=topic, key_id=id_a, limit=2, page=p))["items"]}
    assert seen == set(ids_a)
    assert all(i["key_id"] == id_a for i in only_a["items"])
    only_b = await get(stack, "/memory/fragments", topic=topic, key_id=id_b)
    assert [i["id"] for i in only_b["items"]] == ids_b
    assert (await get(stack, "/memory/fragments", topic=topic, type="decision"))["total"] == 1
    assert (await get(stack, "/memory/fragments", topic=topic, workspace=unique("other")))["total"] == 0
    # topic is a contains match with LIKE wildcards taken literally
    assert (await get(stack, "/memory/fragments", topic=topic[:-3]))["total"] >= 6
    assert (await get(stack, "/memory/fragments", topic=topic + "%"))["total"] == 0
    preview = only_b["items"][0]
    assert preview["preview"].startswith("Tenant B") and preview["workspace"] == ws
    async with admin(stack) as http:
        assert (await http.get("/memory/fragments", params={"type": "bogus"})).status_code == 422


async def test_overview_activity_and_stats_count_what_was_stored(stack: Stack) -> None:
    topic, ws = unique("topic"), unique("ws")
    # Engram counts the daily calls of keys with a daily_limit (core/usage.py)
    key, key_id = await create_api_key(stack.database_url, daily_limit=1000)
    before = await get(stack, "/stats")
    ids = await store(key, stack.mcp_url, ws, topic, ["Overview first: the cache lives in Redis.", "Overview second: sessions expire."])
    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "recall", {"text": "where does the cache live", "topic": topic})

    activity = await get(stack, "/activity")
    assert isinstance(activity, list) and len(activity) <= 10
    assert {a["id"] for a in activity[:2]} == set(ids) and activity[0]["key_id"] == key_id and activity[0]["key_name"]

    overview = await get(stack, "/memory/overview")
    assert {"topic": topic, "count": 2} in overview["byTopic"] or len(overview["byTopic"]) == 50
    assert overview["totalFragments"] >= before["fragments"] + 2 and overview["byType"]["fact"] >= 2
    assert {r["id"] for r in overview["recentActivity"]} >= set(ids)

    stats = await get(stack, "/stats")
    assert stats["fragments"] >= before["fragments"] + 2
    assert stats["apiCallsToday"] >= before["apiCallsToday"] + 2  # batch_remember and recall by an API key
    assert stats["activeKeys"] >= 1 and stats["db"] == "connected" and stats["redis"] == "connected"
    assert set(stats["system"]) == {"cpu", "memory", "disk", "dbSizeBytes"} and stats["system"]["dbSizeBytes"] > 0
    assert stats["searchMetrics"]["total"]["count"] >= 1 and stats["searchMetrics"]["total"]["p50"] is not None
    assert stats["observability"]["total_searches"] >= 1
    assert {"embeddingBacklog", "qualityPending", "unreflectedSessions", "maintenance", "batch"} <= set(stats["queues"])
    assert isinstance(stats["healthFlags"], list) and "redis_disconnected" not in stats["healthFlags"]


async def test_search_events_report_failed_queries_and_feedback(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    nonsense = unique("zqxv")
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "recall", {"keywords": [nonsense]})
        assert reply["fragments"] == []
        await call(s, "tool_feedback", {"tool_name": "recall", "relevant": False, "sufficient": False,
                                        "search_event_id": reply["_meta"]["searchEventId"]})
    report = await get(stack, "/memory/search-events", days=1)
    failed = [q for q in report["failedQueries"] if q["keywords"] == [nonsense]]
    assert failed and failed[0]["result_count"] == 0
    assert report["totalSearches"] >= 1 and report["zeroResultRate"] > 0
    assert report["avgRelevance"] is not None and report["avgRelevance"] < 1
    assert {"p50", "p90", "p99", "avg_ms"} == set(report["latency"]) and report["searchMetrics"]["total"]["count"] >= 1
    assert any(k["kw"] == nonsense for k in report["topKeywords"]) or len(report["topKeywords"]) == 10
    assert (await get(stack, "/memory/search-events", days=9999))["days"] == 365  # clamped like the seed


async def test_graph_detail_amend_and_forget_of_a_fragment(stack: Stack) -> None:
    topic, ws = unique("topic"), unique("ws")
    key, key_id = await create_api_key(stack.database_url)
    error_id, fix_id = await store(key, stack.mcp_url, ws, topic, [
        "Deploy failed: the migration lock was held by a stale job.", "Fix: clear the stale migration lock before deploying."])
    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "link", {"fromId": error_id, "toId": fix_id, "relationType": "resolved_by"})

    graph = await get(stack, "/memory/graph", topic=topic, limit=10)
    assert {n["id"] for n in graph["nodes"]} == {error_id, fix_id}
    assert any(e["from_id"] == error_id and e["to_id"] == fix_id and e["relation_type"] == "resolved_by" for e in graph["edges"])
    assert all(e["from_id"] in {error_id, fix_id} and e["to_id"] in {error_id, fix_id} for e in graph["edges"])
    assert (await get(stack, "/memory/graph", topic=topic, key_id="someone-else"))["nodes"] == []

    async with admin(stack) as http:
        amended = await http.patch(f"/memory/fragments/{error_id}", json={"content": "Deploy failed: a stale job held the migration lock."})
        assert amended.status_code == 200, amended.text
        detail = (await http.get(f"/memory/fragments/{error_id}")).json()
        assert detail["fragment"]["content"] == "Deploy failed: a stale job held the migration lock."
        assert detail["fragment"]["key_id"] == key_id and "embedding" not in detail["fragment"]
        assert detail["versionCount"] >= 1 and any("migration lock was held" in v["content"] for v in detail["versions"])
        assert any(link["id"] == fix_id and link["relation_type"] == "resolved_by" and link["direction"] == "out" for link in detail["links"])
        assert [r["id"] for r in detail["causal"]["resolutions"]] == [fix_id]
        # amend's own validation, through the admin route
        assert (await http.patch(f"/memory/fragments/{error_id}", json={"importance": 7})).status_code == 422
        nan = await http.patch(f"/memory/fragments/{error_id}", content=b'{"importance": NaN}', headers={"content-type": "application/json"})
        assert nan.status_code == 400
        # secrets are screened on this write path too
        leaked = await http.patch(f"/memory/fragments/{error_id}", json={"content": "token ghp_" + "a1B2" * 9})
        assert leaked.status_code in (400, 422) and "ghp_" not in (await http.get(f"/memory/fragments/{error_id}")).text
        forgotten = await http.delete(f"/memory/fragments/{fix_id}")
        assert forgotten.status_code == 200 and forgotten.json()["deleted"] == 1
        assert (await http.get(f"/memory/fragments/{fix_id}")).status_code == 404
        assert (await http.delete(f"/memory/fragments/{fix_id}")).status_code == 404
        assert (await http.patch("/memory/fragments/frag-missing", json={"content": "Nothing is here at all."})).status_code == 404


async def _session_of(stack: Stack, key_id: str) -> dict[str, Any]:
    listed = await get(stack, "/sessions")
    mine = [s for s in listed["sessions"] if s["keyId"] == key_id]
    assert len(mine) == 1, listed
    return {**mine[0], "_counts": listed["counts"]}


async def test_sessions_list_detail_end(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "remember", {"content": "Session views list the tools a session called.", "topic": unique("t"), "type": "fact"})
        await call(s, "recall", {"text": "which tools did the session call"})
        await asyncio.sleep(1.5)  # activity reaches the session row within ACTIVITY_FLUSH_SECONDS
        listed = await _session_of(stack, key_id)
        assert listed["status"] == "active" and listed["live"] and listed["type"] == "streamable"
        assert listed["activity"]["toolCalls"] == {"remember": 1, "recall": 1} and listed["activity"]["lastTool"] == "recall"
        assert listed["_counts"]["total"] >= 1 and listed["_counts"]["unreflected"] >= 0
        assert listed["expiresAt"] and listed["currentSegment"].startswith(listed["sessionId"])

        detail = await get(stack, f"/sessions/{listed['sessionId']}")
        assert detail["sessionId"] == listed["sessionId"] and detail["fragmentCount"] == 1
        assert [e["query_type"] for e in detail["searchEvents"]] == ["text"] and detail["toolFeedback"] == []
        # a segment id names the same session
        assert (await get(stack, f"/sessions/{listed['currentSegment']}"))["sessionId"] == listed["sessionId"]

        async with admin(stack) as http:
            ended = await http.delete(f"/sessions/{listed['sessionId']}")
            assert ended.status_code == 200 and ended.json()["ok"] and ended.json()["wasLive"]
            assert (await http.delete(f"/sessions/{unique('none')}")).status_code == 404
            assert (await http.get(f"/sessions/{unique('none')}")).status_code == 404
        with pytest.raises(MCPError):  # the session's id no longer works
            await s.call_tool("recall", {"text": "anything"})
    after = await get(stack, f"/sessions/{listed['sessionId']}")
    assert after["status"] == "ended" and after["endReason"] == "admin_end"
    assert key_id not in {s["keyId"] for s in (await get(stack, "/sessions"))["sessions"]}
    assert key_id in {s["keyId"] for s in (await get(stack, "/sessions", status="ended", limit=1000))["sessions"]}


async def test_cleanup_ends_sessions_no_replica_holds(stack: Stack) -> None:
    orphan = unique("orphan")
    async with db(stack) as conn:
        await conn.execute(
            """INSERT INTO sessions (id, transport_id, seq, started_at, last_activity_at)
               VALUES ($1, $2, 1, now() - interval '2 hours', now() - interval '2 hours')""",
            f"{orphan}#1", orphan,
        )
    assert (await get(stack, f"/sessions/{orphan}"))["status"] == "active"
    async with admin(stack) as http:
        response = await http.post("/sessions/cleanup")
    assert response.status_code == 200 and response.json()["ok"] and response.json()["orphanSegments"] >= 1
    ended = await get(stack, f"/sessions/{orphan}")
    assert ended["status"] == "ended" and ended["endReason"] == "expired"


async def test_default_mode_is_set_after_creation(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with admin(stack) as http:
        response = await http.put(f"/keys/{key_id}", json={"default_mode": "recall-only"})
        assert response.status_code == 200 and response.json()["default_mode"] == "recall-only"
        assert response.json()["status"] == "active"  # status untouched
        async with mcp_session(stack.mcp_url, raw) as s:
            with pytest.raises(MCPError) as refused:
                await s.call_tool("remember", {"content": "A recall-only key must not store this.", "topic": "t", "type": "fact"})
            assert "recall-only" in refused.value.error.message
        assert (await http.put(f"/keys/{key_id}", json={"default_mode": "no-such-mode"})).status_code == 422
        assert (await http.put(f"/keys/{key_id}", json={})).status_code == 422
        cleared = await http.put(f"/keys/{key_id}", json={"default_mode": None})
        assert cleared.json()["default_mode"] is None
        async with mcp_session(stack.mcp_url, raw) as s:
            await call(s, "remember", {"content": "With the mode cleared the key stores again.", "topic": unique("t"), "type": "fact"})
        listed = {k["id"]: k for k in (await http.get("/keys")).json()}
        assert listed[key_id]["default_mode"] is None


async def test_export_pages_walk_one_tenant_with_a_cursor(stack: Stack) -> None:
    topic, ws = unique("topic"), unique("ws")
    key_a, id_a = await create_api_key(stack.database_url)
    key_b, _ = await create_api_key(stack.database_url)
    ids_a = await store(key_a, stack.mcp_url, ws, topic, [f"Paged export fact {i} about the ledger service." for i in range(5)])
    await store(key_b, stack.mcp_url, ws, topic, ["Another tenant's fact about the ledger service."])
    seen: list[str] = []
    after = None
    first = await get(stack, "/export/page", key_id=id_a, limit=2, total="true")
    assert first["total"] == 5
    while True:
        page = await get(stack, "/export/page", key_id=id_a, limit=2, **({"after": after} if after else {}))
        seen += [row["id"] for row in page["items"]]
        assert all(row["key_id"] == id_a for row in page["items"])
        after = page["nextCursor"]
        if after is None:
            break
    assert sorted(seen) == sorted(ids_a) and len(seen) == 5
    async with admin(stack) as http:
        assert (await http.get("/export/page", params={"after": "not-a-cursor"})).status_code == 400
        assert (await http.get("/export/page", params={"key_id": "no-such-key"})).status_code == 404
