"""A session lives no longer than its key (issue 15, finding 2). seed: the credential given at
initialize is kept for the session, so requests inside it may leave Authorization out; the key
behind it is still checked on every request: set inactive or deleted through the admin API,
its sessions end with an error that says why, and nothing more is read or written. A session
answers to no other credential (another key, the master key)."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from shared.repositories import oauth as oauth_repo
from tests.gateway.wire import RawMcp, db, rpc_body
from tests.support import Stack, unique

ADMIN = "/v1/internal/model/nothing"


async def new_key(http: httpx.AsyncClient, stack: Stack) -> tuple[str, str]:
    """A key made through the admin API, as an operator would: (raw key, key id)."""
    reply = await http.post(
        f"{stack.gateway_url}{ADMIN}/keys", json={"name": unique("rev")}, headers={"Authorization": f"Bearer {stack.master_key}"}
    )
    assert reply.status_code == 201, reply.text
    return reply.json()["raw_key"], reply.json()["id"]


async def admin(http: httpx.AsyncClient, stack: Stack, method: str, path: str, body: dict[str, Any] | None = None) -> None:
    reply = await http.request(
        method, f"{stack.gateway_url}{ADMIN}{path}", json=body, headers={"Authorization": f"Bearer {stack.master_key}"}
    )
    assert reply.status_code == 200, reply.text


def session_only(mcp: RawMcp) -> dict[str, str]:
    """The headers of a request inside the session that carries no credential."""
    return {k: v for k, v in mcp._headers().items() if k != "Authorization"}  # noqa: SLF001


async def post(http: httpx.AsyncClient, url: str, headers: dict[str, str], method: str, params: dict[str, Any] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": secrets.randbelow(10**6) + 10, "method": method}
    if params is not None:
        body["params"] = params
    return await http.post(url, json=body, headers=headers)


def remember(marker: str, ws: str) -> dict[str, Any]:
    content = f"Deploy runbook {marker}: the canary stage waits for ten minutes of clean error rates."
    return {"name": "remember", "arguments": {"content": content, "topic": "deploys", "type": "procedure", "workspace": ws}}


def recall(ws: str) -> dict[str, Any]:
    return {"name": "recall", "arguments": {"keywords": ["canary"], "workspace": ws}}


async def stored(stack: Stack, marker: str) -> int:
    async with db(stack) as conn:
        return int(await conn.fetchval("SELECT count(*) FROM fragments WHERE position($1 in content) > 0", marker))


def refusal(response: httpx.Response, status: int) -> str:
    """The JSON-RPC error message of a refused request (never a bare 500 or a text page)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "result" not in body
    return str(body["error"]["message"])


async def test_deactivated_key_ends_its_sessions_for_reads_and_writes(stack: Stack) -> None:
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        raw, key_id = await new_key(http, stack)
        writer = RawMcp(http, stack.mcp_url, raw)
        await writer.initialize()
        reader = RawMcp(http, stack.mcp_url, raw)
        await reader.initialize()
        kept = unique("kept")
        served = await post(http, stack.mcp_url, session_only(writer), "tools/call", remember(kept, ws))
        assert served.status_code == 200 and "result" in rpc_body(served), served.text

        await admin(http, stack, "PUT", f"/keys/{key_id}", {"status": "inactive"})

        late = unique("late")
        write = await post(http, stack.mcp_url, session_only(writer), "tools/call", remember(late, ws))
        assert "inactive" in refusal(write, 401)
        read = await post(http, stack.mcp_url, session_only(reader), "tools/call", recall(ws))
        assert "inactive" in refusal(read, 401)
        # The sessions are over, with or without the (now refused) key.
        assert (await post(http, stack.mcp_url, session_only(writer), "tools/call", remember(late, ws))).status_code in (401, 404)
        assert (await writer.request("tools/call", remember(late, ws))).status_code == 401
    assert await stored(stack, kept) == 1
    assert await stored(stack, late) == 0
    async with db(stack) as conn:
        reason = await conn.fetchval("SELECT end_reason FROM sessions WHERE id = $1 AND ended_at IS NOT NULL", f"{writer.session_id}#1")
    assert reason == "key_inactive"


async def test_deleted_key_ends_its_session_with_a_clear_error(stack: Stack) -> None:
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        raw, key_id = await new_key(http, stack)
        mcp = RawMcp(http, stack.mcp_url, raw)
        await mcp.initialize()
        assert "result" in await mcp.rpc("tools/list")
        await admin(http, stack, "DELETE", f"/keys/{key_id}")
        marker = unique("gone")
        write = await post(http, stack.mcp_url, session_only(mcp), "tools/call", remember(marker, ws))
        assert "deleted" in refusal(write, 401)
    assert await stored(stack, marker) == 0


async def test_a_session_answers_no_other_credential(stack: Stack) -> None:
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        raw, _ = await new_key(http, stack)
        other, _ = await new_key(http, stack)
        mcp = RawMcp(http, stack.mcp_url, raw)
        await mcp.initialize()
        marker = unique("foreign")
        for intruder in (other, stack.master_key):
            headers = {**session_only(mcp), "Authorization": f"Bearer {intruder}"}
            refused = await post(http, stack.mcp_url, headers, "tools/call", remember(marker, ws))
            assert "another credential" in refusal(refused, 403)
            # not even to end it
            assert (await http.delete(stack.mcp_url, headers=headers)).status_code == 403
        # the session's own credential, or none, still works
        assert "result" in await mcp.rpc("tools/call", recall(ws))
        assert (await post(http, stack.mcp_url, session_only(mcp), "ping")).status_code == 200
        assert (await mcp.delete()).status_code == 200
    assert await stored(stack, marker) == 0


async def test_oauth_session_ends_with_its_key(stack: Stack) -> None:
    """A session opened with an OAuth access token (oat_...) follows the key it was issued for."""
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        _, key_id = await new_key(http, stack)
        token = f"oat_{secrets.token_urlsafe(32)}"
        async with db(stack) as conn:
            client_id = unique("client")
            await oauth_repo.create_client(
                conn, client_id=client_id, client_name="revocation test", redirect_uris=["http://127.0.0.1/cb"], key_id=key_id, metadata={}
            )
            await oauth_repo.create_token(
                conn, token=token, client_id=client_id, key_id=key_id, scopes=["read", "write"],
                expires_at=datetime.now(UTC) + timedelta(hours=1),
            )
        mcp = RawMcp(http, stack.mcp_url, token)
        await mcp.initialize()
        assert (await post(http, stack.mcp_url, session_only(mcp), "tools/call", recall(ws))).status_code == 200
        await admin(http, stack, "PUT", f"/keys/{key_id}", {"status": "inactive"})
        marker = unique("oauth")
        write = await post(http, stack.mcp_url, session_only(mcp), "tools/call", remember(marker, ws))
        assert "inactive" in refusal(write, 401)
    assert await stored(stack, marker) == 0


async def _sse_events(response: httpx.Response, events: asyncio.Queue[dict[str, Any] | str | None]) -> None:
    """Feed the stream's endpoint (a str) and JSON-RPC messages (dicts) to `events`; None at its end."""
    kind = None
    try:
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
                await events.put(data if kind == "endpoint" else json.loads(data))
    except httpx.HTTPError:
        pass  # the server dropped the stream: as much an end as a clean one
    await events.put(None)


async def test_legacy_sse_posts_of_a_deactivated_key_are_refused(stack: Stack) -> None:
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        raw, key_id = await new_key(http, stack)
        events: asyncio.Queue[dict[str, Any] | str | None] = asyncio.Queue()
        async with http.stream("GET", f"{stack.gateway_url}/sse?accessKey={raw}") as stream:
            reader = asyncio.create_task(_sse_events(stream, events))
            endpoint = await asyncio.wait_for(events.get(), 20)
            assert isinstance(endpoint, str) and endpoint.startswith("/message?sessionId=")
            url = f"{stack.gateway_url}{endpoint}"
            headers = {"Content-Type": "application/json"}  # seed: POST /message carries no credential

            async def answered(method: str, params: dict[str, Any]) -> dict[str, Any]:
                accepted = await post(http, url, headers, method, params)
                assert accepted.status_code == 202, accepted.text
                reply = await asyncio.wait_for(events.get(), 30)
                assert isinstance(reply, dict)
                return reply

            assert "result" in await answered("initialize", {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-sse", "version": "1"}})
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
            kept = unique("kept")
            assert "result" in await answered("tools/call", remember(kept, ws))
            # The stream's session answers no other credential on its posts.
            other, _ = await new_key(http, stack)
            foreign = unique("foreign")
            intruder = await post(http, url, {**headers, "Authorization": f"Bearer {other}"}, "tools/call", remember(foreign, ws))
            assert "another credential" in refusal(intruder, 403)
            garbage = await post(http, url, {**headers, "Authorization": "Bearer not-a-key"}, "tools/call", remember(foreign, ws))
            assert refusal(garbage, 401) == "Unauthorized"

            await admin(http, stack, "PUT", f"/keys/{key_id}", {"status": "inactive"})

            late = unique("late")
            refused = await post(http, url, headers, "tools/call", remember(late, ws))
            assert "inactive" in refusal(refused, 401)
            # The stream of the ended session closes, and its id is unknown from now on.
            assert await asyncio.wait_for(events.get(), 20) is None
            await reader
            assert (await post(http, url, headers, "tools/call", remember(late, ws))).status_code == 404
    assert await stored(stack, kept) == 1
    assert await stored(stack, late) == 0
    assert await stored(stack, foreign) == 0


async def test_bearer_on_every_request_is_refused_once_its_key_is_inactive(stack: Stack) -> None:
    """The same credential on each request (what SDK clients send) is refused too, and the
    session it opened ends with it."""
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        raw, key_id = await new_key(http, stack)
        mcp = RawMcp(http, stack.mcp_url, raw)
        await mcp.initialize()
        await admin(http, stack, "PUT", f"/keys/{key_id}", {"status": "inactive"})
        marker = unique("bearer")
        assert "inactive" in refusal(await mcp.request("tools/call", remember(marker, ws)), 401)
        # reactivated, the key opens new sessions; the ended one stays ended
        await admin(http, stack, "PUT", f"/keys/{key_id}", {"status": "active"})
        ended = await post(http, stack.mcp_url, session_only(mcp), "ping")
        assert ended.status_code in (401, 404)
        fresh = RawMcp(http, stack.mcp_url, raw)
        await fresh.initialize()
        assert fresh.session_id != mcp.session_id
        assert (await fresh.delete()).status_code == 200
    assert await stored(stack, marker) == 0
