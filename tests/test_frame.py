"""The frame, end to end: real processes, real Postgres + pgvector, Redis, Celery, MCP clients."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import asyncpg
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from shared.db import SEARCH_PATH
from tests.support import Stack, call, create_api_key, mcp_session, unique


@pytest.fixture
async def tenant_key(stack: Stack) -> str:
    """A fresh tenant per test: results are exact, whatever other tests stored globally."""
    raw, _key_id = await create_api_key(stack.database_url, permissions=["read", "write"])
    return raw


DISTRACTORS = [
    "The billing service retries failed card payments three times before emailing the customer.",
    "Deployments to production happen on Tuesdays after the change advisory board approves them.",
    "The staging Postgres cluster runs version 16 with 32 GB of memory.",
    "Frontend builds use Vite and the bundle must stay under 300 KB gzipped.",
]


async def test_remember_then_recall_by_meaning_and_keyword(mcp_url: str, tenant_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, tenant_key) as s:
        for text in DISTRACTORS:
            await call(s, "remember", {"content": text, "topic": "ops", "type": "fact", "workspace": ws})
        stored = await call(
            s, "remember",
            {"content": "Caroline adopted a golden retriever puppy named Max last spring.",
             "topic": "family", "type": "fact", "workspace": ws},
        )
        assert stored["success"] is True and stored["id"].startswith("frag-")
        # A paraphrase that shares no word with the stored content.
        query = "What dog does she own?"
        stored_words = set(re.findall(r"\w+", "Caroline adopted a golden retriever puppy named Max last spring.".lower()))
        assert not stored_words & set(re.findall(r"\w+", query.lower()))
        found = await call(s, "recall", {"text": query, "workspace": ws})
        assert found["fragments"][0]["id"] == stored["id"]
        assert "L3" in found["searchPath"]

        by_keyword = await call(s, "recall", {"keywords": ["retriever"], "workspace": ws})
        assert by_keyword["fragments"][0]["id"] == stored["id"]
        assert "L2:" in by_keyword["searchPath"]
        # keyword-only recall still takes the semantic fallback (seed: L3kw)
        assert "L3kw" in by_keyword["searchPath"]


async def test_workspace_filter_holds(mcp_url: str, tenant_key: str) -> None:
    ws_a, ws_b = unique("a"), unique("b")
    marker = unique("zebra")
    async with mcp_session(mcp_url, tenant_key) as s:
        in_a = await call(s, "remember", {"content": f"Project {marker} uses Kafka for the event bus.", "topic": "arch", "type": "decision", "workspace": ws_a})
        in_b = await call(s, "remember", {"content": f"Project {marker} uses RabbitMQ for the event bus.", "topic": "arch", "type": "decision", "workspace": ws_b})
        got_a = await call(s, "recall", {"keywords": [marker], "workspace": ws_a})
        got_b = await call(s, "recall", {"keywords": [marker], "workspace": ws_b})
    ids_a = {f["id"] for f in got_a["fragments"]}
    ids_b = {f["id"] for f in got_b["fragments"]}
    assert in_a["id"] in ids_a and in_b["id"] not in ids_a
    assert in_b["id"] in ids_b and in_a["id"] not in ids_b
    assert all(f["workspace"] in (ws_a, None) for f in got_a["fragments"])


async def test_batch_ids_map_to_inputs(mcp_url: str, tenant_key: str) -> None:
    ws = unique()
    items = [
        {"content": f"Service number {i} listens on port {9000 + i} behind the load balancer.", "topic": "ports", "type": "fact"}
        for i in range(5)
    ]
    items.insert(2, {"content": "x" * 4001, "topic": "ports", "type": "fact"})
    items.insert(4, {"content": "too short", "topic": "ports", "type": "fact"})
    items.append({"topic": "ports", "type": "fact"})
    async with mcp_session(mcp_url, tenant_key) as s:
        reply = await call(s, "batch_remember", {"fragments": items, "workspace": ws})
        results = reply["results"]
        assert len(results) == len(items)
        assert [r["index"] for r in results] == list(range(len(items)))
        assert results[2] == {"index": 2, "success": False, "error": "content length 4001 exceeds max 4000"}
        assert results[4]["error"] == "Content too short: length < 10 and word count < 3"
        assert results[-1]["error"] == "content is required"
        assert reply["inserted"] == 5 and reply["failed"] == 3
        for item, result in zip(items, results, strict=True):
            if not result["success"]:
                continue
            port = re.search(r"port (\d+)", item["content"]).group(1)
            found = await call(s, "recall", {"keywords": [port], "workspace": ws, "pageSize": 1})
            assert found["fragments"][0]["id"] == result["id"]
            assert port in found["fragments"][0]["content"]


async def test_forget_removes(mcp_url: str, tenant_key: str) -> None:
    ws = unique()
    marker = unique("walrus")
    async with mcp_session(mcp_url, tenant_key) as s:
        stored = await call(s, "remember", {"content": f"The {marker} cron job rotates logs nightly at 02:00.", "topic": "cron", "type": "fact", "workspace": ws})
        assert (await call(s, "recall", {"keywords": [marker], "workspace": ws}))["count"] == 1
        gone = await call(s, "forget", {"id": stored["id"]})
        assert gone == {"success": True, "deleted": 1}
        assert (await call(s, "recall", {"keywords": [marker], "workspace": ws}))["count"] == 0
        # seed: forgetting again answers success true, deleted 0, error, isError true
        again = await s.call_tool("forget", {"id": stored["id"]})
        assert again.is_error is True
        assert again.structured_content == {"success": True, "deleted": 0, "error": "Fragment not found or no permission"}
        with pytest.raises(MCPError) as missing:
            await s.call_tool("forget", {})
        assert missing.value.error.code == -32602


async def test_forget_by_topic(mcp_url: str, tenant_key: str) -> None:
    ws, topic = unique(), unique("topic")
    async with mcp_session(mcp_url, tenant_key) as s:
        for i in range(3):
            await call(s, "remember", {"content": f"Temporary note number {i} about the migration plan.", "topic": topic, "type": "fact", "workspace": ws})
        assert (await call(s, "forget", {"topic": topic})) == {"success": True, "deleted": 3}
        assert (await call(s, "recall", {"topic": topic, "workspace": ws}))["count"] == 0


async def test_content_over_4000_is_invalid_params(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        with pytest.raises(MCPError) as err:
            await s.call_tool("remember", {"content": "a" * 4001, "topic": "t", "type": "fact"})
        assert err.value.error.code == -32602
        assert "content" in err.value.error.message
        # exactly 4000 is accepted (stored truncated to 300 for non-episode types)
        ok = await call(s, "remember", {"content": "word " * 800, "topic": "t", "type": "fact", "workspace": unique()})
        assert ok["success"] is True


async def test_bad_bearer_is_401(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        for auth in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": "Basic abc"}):
            response = await http.post(stack.mcp_url, json=init, headers={**headers, **auth})
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith('Bearer resource_metadata="')
    with pytest.raises(Exception):
        async with mcp_session(stack.mcp_url, "wrong-key"):
            pass


async def test_tools_list_schemas(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert {"remember", "recall", "batch_remember", "forget", "memory_stats"} <= set(tools)
    remember = tools["remember"].input_schema
    assert set(remember["required"]) == {"content", "topic", "type"}
    assert remember["properties"]["content"]["maxLength"] == 4000
    recall = tools["recall"].input_schema["properties"]
    assert recall["pageSize"]["maximum"] == 50 and recall["pageSize"]["default"] == 20
    assert recall["tokenBudget"]["default"] == 1000
    assert tools["batch_remember"].input_schema["properties"]["fragments"]["maxItems"] == 200
    for tool in tools.values():
        assert set(tool.meta) >= {"capabilities", "riskLevel", "requiresMaster", "beta", "idempotent"}


async def test_recall_fields_and_page_size(mcp_url: str, tenant_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, tenant_key) as s:
        await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"Redis node {i} in the cache cluster holds shard {i}.", "topic": "redis", "type": "fact"} for i in range(8)
        ]})
        page = await call(s, "recall", {"text": "redis cache shards", "workspace": ws, "pageSize": 3, "fields": ["id", "content"]})
        assert page["count"] == 3 and page["hasMore"] is True
        assert all(set(f) == {"id", "content"} for f in page["fragments"])
        budgeted = await call(s, "recall", {"text": "redis cache shards", "workspace": ws, "pageSize": 50, "tokenBudget": 300})
        assert 0 < budgeted["count"] < 8 and budgeted["hasMore"] is True and budgeted["totalTokens"] <= 300
        rest = await call(s, "recall", {"text": "redis cache shards", "workspace": ws, "pageSize": 50, "tokenBudget": 20000, "cursor": page["nextCursor"]})
        assert not {f["id"] for f in rest["fragments"]} & {f["id"] for f in page["fragments"]}
        assert page["count"] + rest["count"] == 8
        with pytest.raises(MCPError) as err:
            await s.call_tool("recall", {"text": "x", "pageSize": 51})
        assert err.value.error.code == -32602 and "pageSize" in err.value.error.message


async def test_memory_stats(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        await call(s, "remember", {"content": "Users prefer dark mode in the admin console.", "topic": "ui", "type": "preference", "workspace": unique()})
        stats = (await call(s, "memory_stats", {}))["stats"]
    assert stats["totalFragments"] >= 1
    assert stats["byType"]["preference"] >= 1
    assert sum(stats["ttlDistribution"].values()) == stats["totalFragments"]


async def test_post_commit_job_reaches_the_worker(stack: Stack, mcp_url: str, master_key: str) -> None:
    """Ingest enqueues auto-linking after commit; the Celery worker links similar fragments."""
    ws = unique()
    async with mcp_session(mcp_url, master_key) as s:
        first = await call(s, "remember", {"content": "The payments API times out when the Stripe webhook queue backs up.", "topic": "payments", "type": "error", "workspace": ws})
        second = await call(s, "remember", {"content": "Payments API timeouts happen whenever the Stripe webhook queue is backed up.", "topic": "payments", "type": "error", "workspace": ws})
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        for _ in range(100):
            linked = not await conn.fetchval("SELECT count(*) FROM fragment_link_pending WHERE fragment_id = $1", second["id"])
            if linked:
                break
            await asyncio.sleep(0.2)
        assert linked, "worker never processed the post-commit job"
        link = await conn.fetchrow("SELECT relation_type, weight FROM fragment_links WHERE from_id = $1 AND to_id = $2", second["id"], first["id"])
        assert link is not None and link["relation_type"] == "related"
    finally:
        await conn.close()
    worker_log = (stack.log_dir / "worker.log").read_text()
    assert "maintenance.link_new_fragments" in worker_log


async def test_internal_services_refuse_other_callers(stack: Stack) -> None:
    body = {"arguments": {"text": "x"}, "principal": {"key_id": None}}
    async with httpx.AsyncClient() as http:
        for url in [*stack.recall_urls, stack.ingest_url]:
            response = await http.post(f"{url}/v1/tools/recall", json=body)
            assert response.status_code == 401
            response = await http.post(f"{url}/v1/tools/recall", json=body, headers={"x-engram-service-token": "guess"})
            assert response.status_code == 401


async def test_health_and_metrics_on_every_service(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        gateway = await http.get(f"{stack.gateway_url}/health")
        assert gateway.status_code == 200
        body = gateway.json()
        assert body["status"] == "healthy"
        assert body["checks"]["database"]["status"] == "ok" and body["checks"]["redis"]["status"] == "ok"
        for url in [stack.gateway_url, *stack.recall_urls, stack.ingest_url]:
            assert (await http.get(f"{url}/health")).status_code == 200
            metrics = await http.get(f"{url}/metrics")
            assert metrics.status_code == 200 and "engram_http_requests_total" in metrics.text


async def test_migrations_rerun_is_noop(stack: Stack) -> None:
    from shared.schema.migrate import migrate

    assert await migrate(stack.database_url) == []
    conn = await asyncpg.connect(stack.database_url)
    try:
        versions = await conn.fetch("SELECT version FROM public.engram_schema_migrations ORDER BY version")
        indexes = {r["indexname"] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = 'agent_memory'")}
    finally:
        await conn.close()
    assert versions[0]["version"] == "0001_init"
    assert {"fragments_embedding_hnsw", "fragments_scope_vectors", "fragment_terms_impact"} <= indexes
    # 0030: indexes no query can use cost every write and are gone.
    assert not {"fragments_keywords_gin", "fragments_tsv_gin", "fragments_session"} & indexes


def test_shared_imports_no_web_framework() -> None:
    root = Path(__file__).resolve().parents[1] / "shared"
    offenders = [
        str(path) for path in root.rglob("*.py")
        if re.search(r"^\s*(from|import)\s+(fastapi|starlette|uvicorn)\b", path.read_text(), re.M)
    ]
    assert offenders == []
