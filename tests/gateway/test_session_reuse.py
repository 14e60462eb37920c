"""Token-based session reuse through real MCP clients: a client that reconnects with the same
Bearer and no Mcp-Session-Id continues its logical session (segment, working memory, mode),
while clients that are live at the same time each keep their own; rotation keeps existing
clients (Streamable HTTP and legacy SSE) working."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.gateway.wire import RawMcp, db
from tests.support import Stack, call, create_api_key, mcp_session, unique


@asynccontextmanager
async def dropping_client(url: str, key: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """An SDK client that goes away without DELETE, as a crashed or restarted agent does."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}", **(headers or {})}, timeout=60) as http:
        async with streamable_http_client(url, http_client=http, terminate_on_close=False) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def active(session: ClientSession) -> dict[str, Any]:
    return json.loads((await session.read_resource("memory://active-session")).contents[0].text)


async def working_memory(session: ClientSession, ws: str) -> set[str]:
    body = await call(session, "context", {"workspace": ws, "tokenBudget": 4000})
    return {f["content"] for f in body["fragments"] if f.get("memory") == "working"}


async def test_reconnect_without_session_id_continues_the_logical_session(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    ws = unique()
    note = f"Working note {ws}: the deploy is paused until the migration finishes."
    async with dropping_client(stack.mcp_url, raw, {"X-Memento-Mode": "audit"}) as first:
        before = await active(first)
        assert before["mode"] == "audit"
        # audit mode refuses writes; the mode is part of what a reconnect inherits
        await first.call_tool("memory_stats", {})
    # A new connection of the same key, no session id, no mode: it continues that session.
    async with dropping_client(stack.mcp_url, raw) as second:
        after = await active(second)
        assert after["sessionId"] == before["sessionId"] and after["segmentId"] == before["segmentId"]
        assert after["transportId"] != before["transportId"] and after["mode"] == "audit"
        assert [a["tool"] for a in after["activity"]] == ["memory_stats"]
    # An explicit mode on reconnect applies to the continued session; its working memory
    # (scope=session) is there for the next reconnect.
    async with dropping_client(stack.mcp_url, raw, {"X-Memento-Mode": "onboarding"}) as third:
        assert (await active(third))["sessionId"] == before["sessionId"]
        stored = await call(third, "remember", {"content": note, "topic": "deploy", "type": "fact", "workspace": ws, "scope": "session"})
        assert stored.get("id")
    async with mcp_session(stack.mcp_url, raw) as fourth:  # deletes its session on exit
        info = await active(fourth)
        assert info["sessionId"] == before["sessionId"] and info["mode"] == "onboarding"
        assert note in await working_memory(fourth, ws)
        async with db(stack) as conn:
            row = await conn.fetchrow("SELECT session_id, key_id FROM fragments WHERE id = $1", stored["id"])
        assert row["session_id"] == info["segmentId"] and row["key_id"] == key_id
    # A session the client ended with DELETE is over: the next connection starts afresh.
    async with mcp_session(stack.mcp_url, raw) as fifth:
        assert (await active(fifth))["sessionId"] != before["sessionId"]
    # Another key never inherits, nor sees the working memory.
    async with dropping_client(stack.mcp_url, other) as stranger:
        assert (await active(stranger))["sessionId"] != before["sessionId"]
        assert note not in await working_memory(stranger, ws)


async def test_live_clients_of_one_key_keep_their_own_sessions(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, raw) as one, mcp_session(stack.mcp_url, raw) as two:
        first, second = await active(one), await active(two)
        assert first["sessionId"] != second["sessionId"]

        async def work(session: ClientSession, n: int) -> list[str]:
            ids = []
            for i in range(3):
                stored = await call(session, "remember", {"content": f"Live client {n} note {i} on the shared key.", "topic": "live", "type": "fact", "workspace": ws})
                ids.append(stored["id"])
            return ids

        a, b = await asyncio.wait_for(asyncio.gather(work(one, 1), work(two, 2)), timeout=120)
        assert len(set(a) | set(b)) == 6
        assert (await active(one))["sessionId"] == first["sessionId"]
        assert (await active(two))["sessionId"] == second["sessionId"]
    # A third connection while another client of the key is live gets its own session too.
    async with mcp_session(stack.mcp_url, raw) as live:
        held = await active(live)
        async with mcp_session(stack.mcp_url, raw) as newcomer:
            assert (await active(newcomer))["sessionId"] != held["sessionId"]


async def test_raw_reconnect_and_concurrent_initialize(stack: Stack) -> None:
    """On the wire: an initialize without Mcp-Session-Id gets its own Mcp-Session-Id (its own
    JSON-RPC id space) and continues the idle session of the same Bearer."""
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        first = RawMcp(http, stack.mcp_url, raw)
        await first.initialize()
        await first.tool("memory_stats", {})
        logical = json.loads((await first.rpc("resources/read", {"uri": "memory://active-session"}))["result"]["contents"][0]["text"])
        # a client that spoke just now is live (no GET stream needed): a second client of the
        # key that initializes meanwhile gets a session of its own, and the first keeps its own
        concurrent = RawMcp(http, stack.mcp_url, raw)
        await concurrent.initialize()
        mine = json.loads((await concurrent.rpc("resources/read", {"uri": "memory://active-session"}))["result"]["contents"][0]["text"])
        assert mine["sessionId"] != logical["sessionId"]
        assert (await first.request("ping")).status_code == 200
        assert (await concurrent.delete()).status_code == 200
        # the first client's GET stream opens and closes: it has gone away
        async with http.stream("GET", stack.mcp_url, headers={**first._headers(), "Accept": "text/event-stream"}) as stream:  # noqa: SLF001
            assert stream.status_code == 200
        again = RawMcp(http, stack.mcp_url, raw)
        await again.initialize()
        assert again.session_id != first.session_id
        info = json.loads((await again.rpc("resources/read", {"uri": "memory://active-session"}))["result"]["contents"][0]["text"])
        assert info["sessionId"] == logical["sessionId"] and info["transportId"] == again.session_id
        # the transport session it took over is over (a client still on it would initialize again)
        assert (await first.request("ping")).status_code == 404
        assert "result" in await again.rpc("ping")
        await again.delete()
        async with db(stack) as conn:
            assert await conn.fetchval("SELECT end_reason FROM sessions WHERE id = $1", logical["segmentId"]) == "client_delete"


async def test_session_rotate_tool_keeps_sdk_clients_working(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, raw) as s:
        before = await active(s)
        rotated = await call(s, "session_rotate", {"reason": "scheduled_rotation"})
        assert rotated["oldSessionId"] == before["transportId"] and rotated["newSessionId"] != before["sessionId"]
        # the SDK keeps sending the id it got at initialize, with its key: still served
        stored = await call(s, "remember", {"content": f"Stored after rotation {ws}.", "topic": "rot", "type": "fact", "workspace": ws})
        info = await active(s)
        assert info["sessionId"] == rotated["newSessionId"] and info["segmentId"] == f"{rotated['newSessionId']}#1"
        async with db(stack) as conn:
            assert await conn.fetchval("SELECT session_id FROM fragments WHERE id = $1", stored["id"]) == info["segmentId"]


async def test_legacy_sse_keeps_working_after_rotate(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    ws = unique()
    sessions: list[str] = []
    async with sse_client(f"{stack.gateway_url}/sse?accessKey={raw}", on_session_created=sessions.append) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            old = sessions[0]
            rotated = await call(s, "session_rotate", {})
            assert rotated["oldSessionId"] == old and rotated["reason"] == "explicit_rotate"
            new = rotated["newSessionId"]
            # The SSE client keeps posting to the endpoint it was given: still served.
            stored = await call(s, "remember", {"content": f"Legacy SSE after rotation {ws}.", "topic": "sse", "type": "fact", "workspace": ws})
            info = await active(s)
            assert info["sessionId"] == new and info["segmentId"] == f"{new}#1"
            async with db(stack) as conn:
                assert await conn.fetchval("SELECT session_id FROM fragments WHERE id = $1", stored["id"]) == info["segmentId"]
            # The new id is a valid message endpoint too; the reply arrives on the stream.
            async with httpx.AsyncClient() as http:
                posted = await http.post(f"{stack.gateway_url}/message?sessionId={new}", json={"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
                assert posted.status_code == 202
            assert (await call(s, "memory_stats", {}))
