"""What the gateway keeps off the database on each tool call still holds: key changes reach
every replica at once (a generation in Redis), daily calls are counted in Redis and reach
Postgres, session activity reaches its row; and all of it works with REDIS_ENABLED=false."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from services.stack.supervisor import free_port
from tests.gateway.conftest import Gateway, start_gateway
from tests.gateway.wire import RawMcp, db
from tests.support import Stack, mcp_session, unique, wait_for

ADMIN = "/v1/internal/model/nothing"


def admin(url: str, master_key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url + ADMIN, headers={"Authorization": f"Bearer {master_key}"}, timeout=30)


async def new_key(url: str, master_key: str, **fields: Any) -> dict[str, Any]:
    async with admin(url, master_key) as http:
        response = await http.post("/keys", json={"name": unique("key"), **fields})
    assert response.status_code == 201, response.text
    return response.json()


async def stats_status(gateway_url: str, key: str) -> int:
    """HTTP status of a fresh session's tool call with this key (401 once it is refused)."""
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, f"{gateway_url}/mcp", key)
        response = await http.post(mcp.url, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        }, headers=mcp.headers)
        if response.status_code != 200:
            return response.status_code
        mcp.session_id = response.headers["mcp-session-id"]
        reply = await mcp.request("tools/call", {"name": "memory_stats", "arguments": {}})
        await mcp.delete()
        return reply.status_code


async def test_key_changes_reach_every_replica_at_once(stack: Stack, replica_gateway: Gateway) -> None:
    key = await new_key(stack.gateway_url, stack.master_key)
    raw = key["raw_key"]
    # the replica has looked the key up (and caches it)
    assert await stats_status(replica_gateway.url, raw) == 200
    async with httpx.AsyncClient(timeout=30) as http:
        live = RawMcp(http, replica_gateway.mcp_url, raw)
        await live.initialize()
        assert (await live.request("ping")).status_code == 200
        # the change is made on the other replica; the next request here is refused
        async with admin(stack.gateway_url, stack.master_key) as http_admin:
            assert (await http_admin.put(f"/keys/{key['id']}", json={"status": "inactive"})).status_code == 200
        assert (await live.request("ping")).status_code == 401
        assert await stats_status(replica_gateway.url, raw) == 401
        async with admin(stack.gateway_url, stack.master_key) as http_admin:
            assert (await http_admin.put(f"/keys/{key['id']}", json={"status": "active"})).status_code == 200
        assert await stats_status(replica_gateway.url, raw) == 200
        async with admin(stack.gateway_url, stack.master_key) as http_admin:
            assert (await http_admin.delete(f"/keys/{key['id']}")).status_code == 200
        assert await stats_status(replica_gateway.url, raw) == 401


async def test_daily_calls_counted_in_redis_start_from_what_postgres_holds(stack: Stack) -> None:
    key = await new_key(stack.gateway_url, stack.master_key, daily_limit=3)
    today = datetime.now(timezone.utc).date()
    async with db(stack) as conn:
        # Calls counted before Redis had this counter (a restart, another day's deploy).
        await conn.execute("INSERT INTO api_key_daily_usage (key_id, day, calls) VALUES ($1, $2, 3)", key["id"], today)
    async with mcp_session(stack.mcp_url, key["raw_key"]) as s:
        with pytest.raises(MCPError) as refused:
            await s.call_tool("memory_stats", {})
        assert refused.value.error.code == -32000 and "Daily limit" in refused.value.error.message
    async with admin(stack.gateway_url, stack.master_key) as http:
        listed = {k["id"]: k for k in (await http.get("/keys")).json()}
    assert listed[key["id"]]["calls_today"] == 4


async def test_calls_on_two_replicas_share_one_daily_count(stack: Stack, replica_gateway: Gateway) -> None:
    key = await new_key(stack.gateway_url, stack.master_key, daily_limit=2)
    async with mcp_session(stack.mcp_url, key["raw_key"]) as s:
        await s.call_tool("memory_stats", {})
    async with mcp_session(replica_gateway.mcp_url, key["raw_key"]) as s:
        await s.call_tool("memory_stats", {})
        with pytest.raises(MCPError):
            await s.call_tool("memory_stats", {})
    # each replica writes what it counted; together they are the day's count
    async with db(stack) as conn:
        async def counted() -> Any:
            calls = await conn.fetchval("SELECT calls FROM api_key_daily_usage WHERE key_id = $1", key["id"])
            return calls == 3
        assert await wait_for(counted)


async def test_everything_works_without_redis(stack: Stack, redisless_gateway: Gateway) -> None:
    url = redisless_gateway.url
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["checks"]["redis"]["status"] == "disabled"
    key = await new_key(url, stack.master_key, daily_limit=1)
    async with mcp_session(f"{url}/mcp", key["raw_key"]) as s:
        await s.call_tool("memory_stats", {})
        with pytest.raises(MCPError) as refused:
            await s.call_tool("memory_stats", {})
        assert refused.value.error.code == -32000
        info = json.loads((await s.read_resource("memory://active-session")).contents[0].text)
        async with db(stack) as conn:
            async def written() -> Any:
                raw = await conn.fetchval("SELECT activity FROM sessions WHERE id = $1", info["segmentId"])
                return raw is not None and [a["tool"] for a in json.loads(raw)] == ["memory_stats"]
            assert await wait_for(written)
    async with admin(url, stack.master_key) as http:
        listed = {k["id"]: k for k in (await http.get("/keys")).json()}
        assert listed[key["id"]]["calls_today"] == 2
        assert (await http.put(f"/keys/{key['id']}/daily-limit", json={"daily_limit": None})).status_code == 200
    assert await stats_status(url, key["raw_key"]) == 200
    async with admin(url, stack.master_key) as http:
        assert (await http.put(f"/keys/{key['id']}", json={"status": "inactive"})).status_code == 200
    assert await stats_status(url, key["raw_key"]) == 401
    # a reconnect without a session id continues the key's session here too
    other = await new_key(url, stack.master_key)
    async with httpx.AsyncClient(timeout=30) as http:
        first = RawMcp(http, f"{url}/mcp", other["raw_key"])
        await first.initialize()
        async with http.stream("GET", first.url, headers={**first._headers(), "Accept": "text/event-stream"}):  # noqa: SLF001
            pass
        second = RawMcp(http, f"{url}/mcp", other["raw_key"])
        await second.initialize()
        reply = await second.rpc("resources/read", {"uri": "memory://active-session"})
        assert json.loads(reply["result"]["contents"][0]["text"])["sessionId"] == first.session_id
        await second.delete()


class _Broken(BaseHTTPRequestHandler):
    """An upstream that answers like a crashed service: HTTP 500 with a plain-text body."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(500)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"Internal Server Error")

    def do_GET(self) -> None:  # noqa: N802
        self.do_POST()

    def log_message(self, *args: Any) -> None:
        pass


async def test_an_upstream_reply_that_is_not_json_is_a_clear_error(stack: Stack) -> None:
    broken = ThreadingHTTPServer(("127.0.0.1", free_port()), _Broken)
    thread = threading.Thread(target=broken.serve_forever, daemon=True)
    thread.start()
    proc, gateway = start_gateway(
        stack, "gateway-broken-recall", 5, {"RECALL_URL": f"http://127.0.0.1:{broken.server_port}"}, require_healthy=False
    )
    try:
        async with mcp_session(gateway.mcp_url, stack.master_key) as s:
            with pytest.raises(MCPError) as failed:
                await s.call_tool("memory_stats", {})
            assert failed.value.error.code == -32603 and failed.value.error.message == "recall service error: HTTP 500"
            # the session and the other service still work
            assert (await s.call_tool("get_skill_guide", {"section": "keywords"})).is_error is False
    finally:
        proc.stop()
        broken.shutdown()
