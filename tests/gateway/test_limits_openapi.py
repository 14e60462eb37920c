"""Body size (413), per-IP and per-key rate limits in Redis (429 + Retry-After), the gateway
without Redis, and /openapi.json."""

from __future__ import annotations

import asyncio

import httpx

from services.stack.supervisor import free_port
from tests.gateway.conftest import Gateway, start_gateway
from tests.gateway.wire import ACCEPT, INIT, RawMcp
from tests.support import Stack, create_api_key


async def test_body_over_one_mib_is_413(stack: Stack) -> None:
    big = {**INIT, "params": {**INIT["params"], "padding": "x" * (1024 * 1024)}}
    headers = {**ACCEPT, "Authorization": f"Bearer {stack.master_key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(stack.mcp_url, json=big, headers=headers)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == -32600
        # chunked (no Content-Length) is counted too
        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(17):
                yield b"x" * 65536
        response = await http.post(f"{stack.gateway_url}/v1/internal/model/nothing/keys", content=chunks(), headers={"Authorization": f"Bearer {stack.master_key}"})
        assert response.status_code == 413
        # just under the limit is served
        fits = {**INIT, "params": {**INIT["params"], "padding": "x" * (1024 * 1024 - 400)}}
        assert (await http.post(stack.mcp_url, json=fits, headers=headers)).status_code == 200


async def _until_429(http: httpx.AsyncClient, send, limit: int) -> httpx.Response:  # type: ignore[no-untyped-def]
    # A one-minute window may roll over once; twice the limit plus one always meets the limit.
    for _ in range(2 * limit + 1):
        response = await send()
        if response.status_code == 429:
            return response
    raise AssertionError("never rate limited")


async def test_per_ip_limit_for_unauthenticated_requests(limited_gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await _until_429(http, lambda: http.get(f"{limited_gateway.url}/.well-known/oauth-authorization-server"), 8)
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # health and metrics stay reachable for probes
        assert (await http.get(f"{limited_gateway.url}/health")).status_code == 200


async def test_per_key_limit_is_shared_through_redis(stack: Stack, limited_gateway: Gateway) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, limited_gateway.mcp_url, raw)
        await mcp.initialize()
        refused = await _until_429(http, lambda: mcp.request("tools/list"), 6)
        assert int(refused.headers["retry-after"]) >= 1
        # the counter lives in Redis: a second replica on the same Redis refuses the key too
        twin_proc, twin = start_gateway(stack, "gateway-limited-twin", 1, {"RATE_LIMIT_PER_KEY_PER_MIN": "6"})
        try:
            other = await http.get(f"{twin.url}/openapi.json", headers={"Authorization": f"Bearer {raw}"})
            if other.status_code != 429:  # the window rolled over between the two: fill it again
                await _until_429(http, lambda: mcp.request("tools/list"), 6)
                other = await http.get(f"{twin.url}/openapi.json", headers={"Authorization": f"Bearer {raw}"})
            assert other.status_code == 429
        finally:
            await asyncio.to_thread(twin_proc.stop)
        # the master key is not metered
        master = RawMcp(http, limited_gateway.mcp_url, stack.master_key)
        await master.initialize()
        for _ in range(10):
            assert (await master.request("tools/list")).status_code == 200


async def test_limits_hold_without_redis(stack: Stack) -> None:
    proc, gateway = start_gateway(
        stack, "gateway-noredis", 0, {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "RATE_LIMIT_PER_IP_PER_MIN": "5"},
    )
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            mcp = RawMcp(http, gateway.mcp_url, stack.master_key)
            await mcp.initialize()
            assert (await mcp.tool("memory_stats", {}))["result"]
            refused = await _until_429(http, lambda: http.get(f"{gateway.url}/.well-known/oauth-protected-resource"), 5)
            assert refused.headers["retry-after"]
    finally:
        await asyncio.to_thread(proc.stop)


async def test_openapi_is_off_by_default(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{stack.gateway_url}/openapi.json", headers={"Authorization": f"Bearer {stack.master_key}"})
        assert response.status_code == 404


async def test_openapi_by_caller(stack: Stack, tuned_gateway: Gateway) -> None:
    reader, _ = await create_api_key(stack.database_url, permissions=["read"])
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{tuned_gateway.url}/openapi.json")).status_code == 401
        full = (await http.get(f"{tuned_gateway.url}/openapi.json", headers={"Authorization": f"Bearer {stack.master_key}"})).json()
        assert full["openapi"] == "3.1.0"
        assert {"/mcp", "/sse", "/message", "/health", "/session/rotate", "/v1/internal/model/nothing/keys",
                "/v1/internal/model/nothing/keys/{key_id}/daily-limit", "/v1/internal/model/nothing/groups"} <= set(full["paths"])
        names = {t["name"] for t in full["x-mcp-tools"]}
        assert {"remember", "recall", "forget"} <= names
        limited = (await http.get(f"{tuned_gateway.url}/openapi.json", headers={"Authorization": f"Bearer {reader}"})).json()
        assert not [p for p in limited["paths"] if p.startswith("/v1/internal/model/nothing")]
        visible = {t["name"] for t in limited["x-mcp-tools"]}
        assert "recall" in visible and "get_skill_guide" in visible
        assert not visible & {"remember", "forget", "batch_remember", "session_rotate"}
        assert all(f"{name}_arguments" in limited["components"]["schemas"] for name in visible)
