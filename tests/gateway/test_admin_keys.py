"""Keys, groups and tenants through the admin REST API (master key only)."""

from __future__ import annotations

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.wire import RawMcp, db
from tests.support import Stack, call, create_api_key, mcp_session, unique

ADMIN = "/v1/internal/model/nothing"


def admin(stack: Stack, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key or stack.master_key}"}
    return httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, headers=headers, timeout=30)


async def new_key(stack: Stack, **fields) -> dict:  # type: ignore[no-untyped-def]
    async with admin(stack) as http:
        response = await http.post("/keys", json={"name": unique("key"), **fields})
    assert response.status_code == 201, response.text
    return response.json()


async def test_auth_endpoint_checks_the_master_key(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN) as http:
        assert (await http.post("/auth", headers={"Authorization": f"Bearer {stack.master_key}"})).json() == {"success": True}
        assert (await http.post("/auth", json={"key": stack.master_key})).status_code == 200
        assert (await http.post("/auth", json={"key": "nope"})).status_code == 401
        assert (await http.post("/auth")).status_code == 401


async def test_admin_routes_are_master_only(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url, permissions=["read", "write", "admin"])
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN) as http:
        for method, path in (("GET", "/keys"), ("POST", "/keys"), ("GET", "/groups"), ("DELETE", "/keys/x")):
            assert (await http.request(method, path)).status_code == 401
            # even an API key with admin permission is not the master key
            response = await http.request(method, path, headers={"Authorization": f"Bearer {raw}"})
            assert response.status_code == 403


async def test_key_lifecycle(stack: Stack) -> None:
    created = await new_key(stack, permissions=["read"], fragment_limit=10, default_mode="recall-only")
    raw = created["raw_key"]
    assert raw.startswith("mmcp_") and created["key_prefix"] == raw[:12]
    assert created["permissions"] == ["read"] and created["status"] == "active"
    key_id = created["id"]
    async with db(stack) as conn:
        stored = await conn.fetchrow("SELECT key_hash FROM api_keys WHERE id = $1", key_id)
    assert raw not in stored["key_hash"] and len(stored["key_hash"]) == 64
    async with admin(stack) as http:
        listed = {k["id"]: k for k in (await http.get("/keys")).json()}
        assert key_id in listed and "raw_key" not in listed[key_id] and "key_hash" not in listed[key_id]
        assert listed[key_id]["fragment_count"] == 0

        assert (await http.put(f"/keys/{key_id}/daily-limit", json={"daily_limit": 50000})).json() == {"success": True, "daily_limit": 50000}
        assert (await http.patch(f"/keys/{key_id}/workspace", json={"workspace": "proj"})).json()["default_workspace"] == "proj"
        assert (await http.patch(f"/keys/{key_id}/workspace", json={"workspace": None})).json()["default_workspace"] is None
        assert (await http.put(f"/keys/{key_id}/daily-limit", json={"daily_limit": -1})).status_code == 422
        assert (await http.put("/keys/missing/daily-limit", json={"daily_limit": 1})).status_code == 404
        assert (await http.post("/keys", json={"name": "x", "permissions": ["root"]})).status_code == 422

        async with mcp_session(stack.mcp_url, raw) as s:
            await s.list_tools()
        assert (await http.put(f"/keys/{key_id}", json={"status": "inactive"})).json()["status"] == "inactive"
        with pytest.raises(Exception):
            async with mcp_session(stack.mcp_url, raw):
                pass
        assert (await http.put(f"/keys/{key_id}", json={"status": "active"})).json()["status"] == "active"
        async with mcp_session(stack.mcp_url, raw) as s:
            await s.list_tools()
        assert (await http.delete(f"/keys/{key_id}")).json() == {"success": True}
        assert (await http.delete(f"/keys/{key_id}")).status_code == 404
    with pytest.raises(Exception):
        async with mcp_session(stack.mcp_url, raw):
            pass


async def test_groups_share_visibility_and_tenants_stay_apart(stack: Stack) -> None:
    a = await new_key(stack)
    b = await new_key(stack)
    c = await new_key(stack)
    ws, marker = unique(), unique("okapi")
    async with mcp_session(stack.mcp_url, a["raw_key"]) as s:
        stored = await call(s, "remember", {"content": f"The {marker} service stores invoices in S3 buckets.", "topic": "billing", "type": "fact", "workspace": ws})

    async def visible_to(raw: str) -> set[str]:
        async with mcp_session(stack.mcp_url, raw) as s:
            return {f["id"] for f in (await call(s, "recall", {"keywords": [marker], "workspace": ws}))["fragments"]}

    assert stored["id"] not in await visible_to(b["raw_key"])
    async with admin(stack) as http:
        group = (await http.post("/groups", json={"name": unique("team"), "description": "shared"})).json()
        assert (await http.post("/groups", json={"name": group["name"]})).status_code == 409
        for member in (a, b):
            assert (await http.post(f"/groups/{group['id']}/members", json={"key_id": member["id"]})).status_code == 201
        assert (await http.post(f"/groups/{group['id']}/members", json={"key_id": "missing"})).status_code == 404
        members = {m["id"] for m in (await http.get(f"/groups/{group['id']}/members")).json()}
        assert members == {a["id"], b["id"]}
        assert any(g["id"] == group["id"] and g["member_count"] == 2 for g in (await http.get("/groups")).json())

        assert stored["id"] in await visible_to(b["raw_key"])
        assert stored["id"] not in await visible_to(c["raw_key"])
        # Another tenant's fragment id is "not found", never "forbidden".
        async with mcp_session(stack.mcp_url, c["raw_key"]) as s:
            refused = await s.call_tool("forget", {"id": stored["id"]})
        assert refused.is_error and refused.structured_content["error"] == "Fragment not found or no permission"
        # The master key sees every tenant, with key_id on each fragment. Its workspace scope
        # also holds every tenant's global fragments (20,000 after the memory API's transfer
        # test), whose graph and vector hits can fill a first page; the topic keeps to this one.
        async with mcp_session(stack.mcp_url, stack.master_key) as s:
            found = (await call(s, "recall", {"keywords": [marker], "workspace": ws, "topic": "billing"}))["fragments"]
        assert [f.get("key_id") for f in found if f["id"] == stored["id"]] == [a["id"]]

        assert (await http.delete(f"/groups/{group['id']}/members/{b['id']}")).json() == {"success": True}
        assert (await http.delete(f"/groups/{group['id']}/members/{b['id']}")).status_code == 404
        assert stored["id"] not in await visible_to(b["raw_key"])
        assert (await http.delete(f"/groups/{group['id']}")).json() == {"success": True}
        assert (await http.get(f"/groups/{group['id']}/members")).status_code == 404


async def test_rate_limit_headers_only_for_keys_with_a_fragment_limit(stack: Stack) -> None:
    limited = await new_key(stack, fragment_limit=5000)
    unlimited = await new_key(stack)
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, limited["raw_key"])
        await mcp.initialize()
        for i in range(2):
            await mcp.tool("remember", {"content": f"Limited key fact number {i} about the quota.", "topic": "q", "type": "fact", "workspace": ws})
        # usage is cached for 10 s, so the count may lag; the headers are always there
        response = await mcp.request("tools/call", {"name": "memory_stats", "arguments": {}})
        assert response.headers["x-ratelimit-limit"] == "5000"
        assert 4998 <= int(response.headers["x-ratelimit-remaining"]) <= 5000
        assert response.headers["x-ratelimit-resource"] == "fragments"
        listing = await mcp.request("tools/list")
        assert "x-ratelimit-limit" not in listing.headers  # only tool calls carry them

        for key in (unlimited["raw_key"], stack.master_key):
            other = RawMcp(http, stack.mcp_url, key)
            await other.initialize()
            response = await other.request("tools/call", {"name": "memory_stats", "arguments": {}})
            assert response.status_code == 200 and "x-ratelimit-limit" not in response.headers


async def test_daily_limit_refuses_calls_past_it(stack: Stack) -> None:
    key = await new_key(stack, daily_limit=2)
    async with mcp_session(stack.mcp_url, key["raw_key"]) as s:
        await s.call_tool("memory_stats", {})
        await s.call_tool("memory_stats", {})
        with pytest.raises(MCPError) as refused:
            await s.call_tool("memory_stats", {})
        assert refused.value.error.code == -32000 and "Daily limit" in refused.value.error.message
    async with admin(stack) as http:
        listed = {k["id"]: k for k in (await http.get("/keys")).json()}
        assert listed[key["id"]]["calls_today"] == 3 and listed[key["id"]]["daily_limit"] == 2
        await http.put(f"/keys/{key['id']}/daily-limit", json={"daily_limit": None})
    async with mcp_session(stack.mcp_url, key["raw_key"]) as s:
        await s.call_tool("memory_stats", {})
