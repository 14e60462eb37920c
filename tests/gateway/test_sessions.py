"""Sessions: rows per segment, token-based reuse, segment rotation on idle, explicit close,
the auto-reflect hook, POST /session/rotate and the session_rotate tool, legacy SSE."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import redis.asyncio as aioredis
from mcp import ClientSession
from mcp.client.sse import sse_client

from tests.gateway.conftest import Gateway
from tests.gateway.wire import RawMcp, db, rpc_body
from tests.support import Stack, call, create_api_key, mcp_session, unique, wait_for


async def active_session(mcp: RawMcp) -> dict[str, Any]:
    reply = await mcp.rpc("resources/read", {"uri": "memory://active-session"})
    return json.loads(reply["result"]["contents"][0]["text"])


async def reflect_jobs(stack: Stack, db_number: int = 3) -> list[dict[str, Any]]:
    """auto_reflect jobs a test gateway sent (its broker database has no worker)."""
    client = aioredis.Redis.from_url(stack.redis_url.rpartition("/")[0] + f"/{db_number}")
    try:
        raw = await client.lrange("maintenance", 0, -1)
    finally:
        await client.aclose()
    jobs = []
    for item in raw:
        message = json.loads(item)
        if message["headers"]["task"] != "maintenance.auto_reflect":
            continue
        _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        jobs.append(kwargs)
    return jobs


async def test_session_rows_segments_and_delete(stack: Stack, tuned_gateway: Gateway) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, tuned_gateway.mcp_url, raw)
        await mcp.initialize()
        sid = mcp.session_id
        assert sid
        await mcp.tool("memory_stats", {})
        info = await active_session(mcp)
        assert info["sessionId"] == sid and info["segmentId"] == f"{sid}#1"
        assert [a["tool"] for a in info["activity"]] == ["memory_stats"]
        async with db(stack) as conn:
            row = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", f"{sid}#1")
            assert row["transport_id"] == sid and row["key_id"] == key_id and row["ended_at"] is None

            async def written() -> Any:  # activity reaches the row behind the call
                return json.loads(await conn.fetchval("SELECT activity FROM sessions WHERE id = $1", f"{sid}#1"))

            assert (await wait_for(written))[0]["tool"] == "memory_stats"

        # idle longer than MEMENTO_SESSION_SEGMENT_IDLE (1 s here): the next call opens #2
        await asyncio.sleep(1.5)
        await mcp.tool("memory_stats", {})
        assert (await active_session(mcp))["segmentId"] == f"{sid}#2"
        async with db(stack) as conn:
            first = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", f"{sid}#1")
            second = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", f"{sid}#2")
        assert first["end_reason"] == "segment_idle" and first["ended_at"] is not None
        assert second["seq"] == 2 and second["previous_id"] == f"{sid}#1" and second["ended_at"] is None
        assert {"session_id": f"{sid}#1", "key_id": key_id, "reason": "segment_idle"} in await reflect_jobs(stack)

        assert (await mcp.delete()).status_code == 200
        async with db(stack) as conn:
            ended = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", f"{sid}#2")
        assert ended["end_reason"] == "client_delete" and ended["ended_at"] is not None
        assert {"session_id": f"{sid}#2", "key_id": key_id, "reason": "client_delete"} in await reflect_jobs(stack)
        assert (await mcp.request("tools/list")).status_code == 404


async def test_token_based_session_reuse(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        first = RawMcp(http, stack.mcp_url, raw)
        await first.initialize()
        # same Bearer, no Mcp-Session-Id on a request inside a session: the session comes back
        bare = await http.post(
            stack.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers={**first.headers, "mcp-protocol-version": "2025-06-18"},
        )
        assert bare.status_code == 200 and bare.headers["mcp-session-id"] == first.session_id
        # A second initialize with the same Bearer is a second client: its own session, so two
        # live clients of one key never share JSON-RPC ids.
        again = RawMcp(http, stack.mcp_url, raw)
        await again.initialize()
        assert again.session_id != first.session_id
        stranger = RawMcp(http, stack.mcp_url, other)
        await stranger.initialize()
        assert stranger.session_id != first.session_id
        # a session answers only the credential that opened it (403, as rotate answers a
        # session that is not the caller's)
        stolen = await http.post(
            stack.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
            headers={**stranger.headers, "mcp-session-id": first.session_id, "mcp-protocol-version": "2025-06-18"},
        )
        assert stolen.status_code == 403 and stolen.json()["error"]["message"].startswith("Forbidden")
        await first.delete()
        await stranger.delete()
        fresh = RawMcp(http, stack.mcp_url, raw)
        await fresh.initialize()
        assert fresh.session_id != first.session_id
        await fresh.delete()


async def test_two_clients_with_one_key_both_get_their_replies(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    ws = unique()

    async def client(n: int) -> list[str]:
        async with mcp_session(stack.mcp_url, raw) as s:
            ids = []
            for i in range(3):
                stored = await call(s, "remember", {"content": f"Client {n} stored note number {i} about the parallel run.",
                                                    "topic": "parallel", "type": "fact", "workspace": ws})
                ids.append(stored["id"])
            return ids

    first, second = await asyncio.wait_for(asyncio.gather(client(1), client(2)), timeout=120)
    assert len(set(first) | set(second)) == 6


async def _rotate(http: httpx.AsyncClient, gateway: Gateway, key: str | None, session_id: str | None, origin: str | None = "https://example.com", body: Any = None) -> httpx.Response:
    headers = {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if session_id:
        headers["Mcp-Session-Id"] = session_id
    if origin:
        headers["Origin"] = origin
    return await http.post(f"{gateway.url}/session/rotate", headers=headers, json=body)


async def test_rotate_endpoint_policy(stack: Stack, tuned_gateway: Gateway) -> None:
    owner, owner_id = await create_api_key(stack.database_url)
    intruder, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, tuned_gateway.mcp_url, owner, {"X-Memento-Mode": "audit"})
        await mcp.initialize()
        await mcp.tool("memory_stats", {})
        sid = mcp.session_id
        assert sid
        unauth = await _rotate(http, tuned_gateway, None, sid)
        assert unauth.status_code == 401 and "resource_metadata=" in unauth.headers["www-authenticate"]
        assert (await _rotate(http, tuned_gateway, owner, sid, origin=None)).status_code == 403
        assert (await _rotate(http, tuned_gateway, owner, sid, origin="https://evil.example")).status_code == 403
        assert (await _rotate(http, tuned_gateway, intruder, sid)).status_code == 403
        assert (await _rotate(http, tuned_gateway, owner, None)).status_code == 400
        assert (await _rotate(http, tuned_gateway, owner, "0" * 32)).status_code == 404
        assert (await _rotate(http, tuned_gateway, owner, sid, body={"reason": "x" * 129})).status_code == 400

        rotated = await _rotate(http, tuned_gateway, owner, sid, body={"reason": "suspected_leak"})
        assert rotated.status_code == 200, rotated.text
        body = rotated.json()
        assert body["ok"] is True and body["oldSessionId"] == sid and body["reason"] == "suspected_leak"
        new_sid = body["newSessionId"]
        assert new_sid != sid and body["rotatedAt"].endswith("Z")
        # The old id no longer stands for the credential on its own (it may have leaked) ...
        bare = {k: v for k, v in mcp._headers().items() if k != "Authorization"}  # noqa: SLF001
        ping = {"jsonrpc": "2.0", "id": 50, "method": "ping"}
        assert (await http.post(tuned_gateway.mcp_url, json=ping, headers=bare)).status_code == 401
        stolen = await http.post(tuned_gateway.mcp_url, json=ping, headers={**bare, "Authorization": f"Bearer {intruder}"})
        assert stolen.status_code == 403
        # ... but the client holding the key keeps its connection (seed: "MCP connection state
        # is not affected"): the old id reaches the same session, now under the new id.
        still = await mcp.request("resources/read", {"uri": "memory://active-session"})
        assert still.status_code == 200 and still.headers["mcp-session-id"] == new_sid
        assert json.loads(rpc_body(still)["result"]["contents"][0]["text"])["sessionId"] == new_sid
        # the new id carries the same session state (mode, activity), alone or with the key
        assert (await http.post(tuned_gateway.mcp_url, json=ping, headers={**bare, "mcp-session-id": new_sid})).status_code == 200
        mcp.session_id = new_sid
        listed = {t["name"] for t in (await mcp.rpc("tools/list"))["result"]["tools"]}
        assert "remember" not in listed and "recall" in listed
        info = await active_session(mcp)
        assert info["sessionId"] == new_sid and info["segmentId"] == f"{new_sid}#1"
        assert [a["tool"] for a in info["activity"]][:1] == ["memory_stats"]
        default = await _rotate(http, tuned_gateway, owner, new_sid, origin="http://localhost:3000")
        assert default.status_code == 200 and default.json()["reason"] == "explicit_rotate"
        async with db(stack) as conn:
            old_row = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", f"{sid}#1")
        assert old_row["end_reason"] == "suspected_leak"
        assert {"session_id": f"{sid}#1", "key_id": owner_id, "reason": "suspected_leak"} in await reflect_jobs(stack)
        metrics = (await http.get(f"{tuned_gateway.url}/metrics")).text
        assert 'mcp_session_rotation_total{reason="suspected_leak"} 1.0' in metrics


async def test_rotate_rate_limit_per_ip(stack: Stack, limited_gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        statuses = []
        # 3 per minute; a window boundary can reset the count at most once in 7 tries
        for _ in range(7):
            # the master key: the gateway-wide per-IP limit must not answer first
            response = await _rotate(http, limited_gateway, stack.master_key, "x")
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {403}  # Origin not on this gateway's list
        metrics = (await http.get(f"{limited_gateway.url}/metrics")).text
        assert "mcp_rotate_rate_limited_total 1.0" in metrics


async def test_session_rotate_tool(stack: Stack, tuned_gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, tuned_gateway.mcp_url, stack.master_key)
        await mcp.initialize()
        sid = mcp.session_id
        too_long = await mcp.tool("session_rotate", {"reason": "y" * 257})
        assert too_long["error"]["code"] == -32602
        result = (await mcp.tool("session_rotate", {"reason": "scheduled_rotation"}))["result"]
        body = result["structuredContent"]
        assert body["ok"] is True and body["oldSessionId"] == sid and body["reason"] == "scheduled_rotation"
        mcp.session_id = body["newSessionId"]
        assert (await mcp.rpc("tools/list"))["result"]["tools"]
        # DELETE with the new id ends the session: the old id is gone with it
        assert (await mcp.delete()).status_code == 200
        mcp.session_id = sid
        assert (await mcp.request("tools/list")).status_code == 404


async def test_legacy_sse_transport(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{stack.gateway_url}/sse")).status_code == 401
        assert (await http.get(f"{stack.gateway_url}/sse?accessKey=wrong")).status_code == 401
        async with http.stream("GET", f"{stack.gateway_url}/sse?accessKey={raw}") as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    endpoint = line[5:].strip()
                    break
        assert endpoint.startswith("/message?sessionId=")
    ws = unique()
    sessions: list[str] = []
    async with sse_client(f"{stack.gateway_url}/sse?accessKey={raw}", on_session_created=sessions.append) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            assert {"remember", "recall", "get_skill_guide", "session_rotate"} <= names
            stored = await call(s, "remember", {"content": "Legacy SSE clients can still store memories here.", "topic": "sse", "type": "fact", "workspace": ws})
            found = await call(s, "recall", {"keywords": ["legacy"], "workspace": ws})
            assert stored["id"] in {f["id"] for f in found["fragments"]}
            info = json.loads((await s.read_resource("memory://active-session")).contents[0].text)
            assert info["transport"] == "sse" and info["keyId"] == key_id
            segment = info["segmentId"]
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"{stack.gateway_url}/health")).json()
            assert health["checks"]["sessions"]["sse"] >= 1
    async with db(stack) as conn:
        async def ended() -> Any:
            return await conn.fetchval("SELECT end_reason FROM sessions WHERE id = $1 AND ended_at IS NOT NULL", segment)
        assert await wait_for(ended) in ("sse_disconnect", "session_end")


async def test_sse_message_needs_a_live_session(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{stack.gateway_url}/message?sessionId={'0' * 32}", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 404
        assert (await http.post(f"{stack.gateway_url}/message", json={})).status_code == 400


async def test_idle_session_expires_and_is_reflected(stack: Stack, limited_gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        raw, key_id = await create_api_key(stack.database_url)
        mcp = RawMcp(http, limited_gateway.mcp_url, raw)
        await mcp.initialize()
        await mcp.tool("memory_stats", {})
        segment = (await active_session(mcp))["segmentId"]
        assert segment == f"{mcp.session_id}#1"

        async def ended() -> Any:
            async with db(stack) as conn:
                return await conn.fetchval("SELECT end_reason FROM sessions WHERE id = $1 AND ended_at IS NOT NULL", segment)

        # MEMENTO_SESSION_IDLE_TIMEOUT is 3 s on this gateway
        assert await wait_for(ended, timeout=30) == "session_end"
        job = {"session_id": segment, "key_id": key_id, "reason": "session_end"}

        async def sent() -> bool:  # the job follows the row's end
            return job in await reflect_jobs(stack, 1)

        assert await wait_for(sent)
        assert (await mcp.request("tools/list")).status_code == 404


async def test_get_opens_the_server_push_stream(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, stack.master_key)
        await mcp.initialize()
        headers = {**mcp._headers(), "Accept": "text/event-stream"}  # noqa: SLF001
        async with http.stream("GET", stack.mcp_url, headers=headers) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.headers["mcp-session-id"] == mcp.session_id
        unknown = await http.get(stack.mcp_url, headers={"Accept": "text/event-stream", "mcp-session-id": "f" * 32})
        assert unknown.status_code == 401 and "resource_metadata=" in unknown.headers["www-authenticate"]
        assert (await mcp.delete()).status_code == 200


async def test_session_keeps_the_credential_of_initialize(stack: Stack) -> None:
    """seed: Streamable HTTP authenticates at initialize; the session carries it afterwards."""
    raw, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, raw)
        await mcp.initialize()
        bare = {k: v for k, v in mcp._headers().items() if k != "Authorization"}  # noqa: SLF001
        reply = await http.post(stack.mcp_url, json={"jsonrpc": "2.0", "id": 5, "method": "resources/read", "params": {"uri": "memory://active-session"}}, headers=bare)
        assert reply.status_code == 200
        assert json.loads(rpc_body(reply)["result"]["contents"][0]["text"])["keyId"] == key_id
        # another credential still cannot use it
        stolen = await http.post(stack.mcp_url, json={"jsonrpc": "2.0", "id": 6, "method": "tools/list"}, headers={**bare, "Authorization": f"Bearer {other}"})
        assert stolen.status_code == 403
        # nor a wrong one
        wrong = await http.post(stack.mcp_url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}, headers={**bare, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        await mcp.delete()
        gone = await http.post(stack.mcp_url, json={"jsonrpc": "2.0", "id": 8, "method": "tools/list"}, headers=bare)
        assert gone.status_code == 401


async def test_unused_segment_is_ended_without_a_reflect_job(stack: Stack, tuned_gateway: Gateway) -> None:
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, tuned_gateway.mcp_url, raw)
        await mcp.initialize()
        await mcp.rpc("tools/list")  # listing is not a tool call
        segment = f"{mcp.session_id}#1"
        assert (await mcp.delete()).status_code == 200
    async with db(stack) as conn:
        assert await conn.fetchval("SELECT end_reason FROM sessions WHERE id = $1", segment) == "client_delete"
    assert segment not in {job["session_id"] for job in await reflect_jobs(stack)}
