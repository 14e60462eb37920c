"""A replica remembers the sessions it resolved (services/gateway/sessions/service.py, Known),
so a request of a session it knows moves no session document. The store still checks every
request: whatever another replica changed (a rotate, a mode, a DELETE) is seen by this one
on its next request, never a stale copy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.gateway.core.round_trip import RoundTrip
from services.gateway.sessions import FallbackSessionStore, MemorySessionStore, RedisSessionStore, Sessions
from services.stack.supervisor import Stack
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.redis_breaker import request_path_redis
from shared.settings import GatewaySettings
from tests.gateway.conftest import Gateway
from tests.gateway.test_hot_path import new_key
from tests.gateway.wire import RawMcp

STATS = {"name": "memory_stats", "arguments": {}}


@pytest.fixture
async def sessions(stack: Stack) -> AsyncIterator[Sessions]:
    """The session owner on the stack's Redis and database, as a gateway builds it."""
    settings = GatewaySettings(DATABASE_URL=stack.database_url, REDIS_URL=stack.redis_url)
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    redis = request_path_redis(stack.redis_url, settings)
    try:
        yield Sessions(settings, FallbackSessionStore(RedisSessionStore(redis), MemorySessionStore()), pool, None)
    finally:
        await redis.aclose()
        await pool.close()


async def _resolve(sessions: Sessions, client_id: str, tool: str | None = "memory_stats") -> tuple[Any, Any]:
    trip = RoundTrip(sessions.store.primary.redis)  # type: ignore[attr-defined]
    resolving = sessions.queue_resolve(trip, client_id, tool)
    await trip.run()
    return await sessions.resolved(resolving), resolving


async def test_a_known_session_comes_back_without_its_document_until_it_changes(sessions: Sessions) -> None:
    opened = await sessions.open("streamable-http", Principal.master(), None, None)
    first, resolving = await _resolve(sessions, opened.client_id)
    assert first is not None and resolving.loaded.found is not None  # read in full once
    again, resolving = await _resolve(sessions, opened.client_id)
    assert again is first and resolving.loaded.found is None  # then only the call's outcome
    ahead = await sessions.called_ahead(resolving, again, "memory_stats")
    assert ahead is not None and ahead.recorded.outcome == "recorded"
    assert (await sessions.current_segment(again, "memory_stats", None, ahead))[0] == f"{opened.session_id}#1"

    await sessions.set_mode(first, "audit")  # any change but a call's counters: read in full again
    changed, resolving = await _resolve(sessions, opened.client_id, None)
    assert resolving.loaded.found is not None and changed is not None and changed.mode == "audit"
    assert (await _resolve(sessions, opened.client_id))[1].loaded.found is None

    # Three calls were recorded ahead, each in the one command that resolved the session.
    assert [a["tool"] for a in await sessions.activity(opened)] == ["memory_stats"] * 3
    await sessions.detach(changed, "client_delete")
    assert (await _resolve(sessions, opened.client_id))[0] is None


async def test_changes_made_on_another_replica_reach_a_replica_that_knows_the_session(
    stack: Stack, replica_gateway: Gateway
) -> None:
    key = (await new_key(stack.gateway_url, stack.master_key))["raw_key"]
    async with httpx.AsyncClient(timeout=30) as http:
        a = RawMcp(http, stack.mcp_url, key)
        await a.initialize()
        b = RawMcp(http, replica_gateway.mcp_url, key)
        b.session_id = a.session_id
        assert "result" in await a.rpc("tools/call", STATS)
        # Without a credential a live session id stands for its key: served from what A knows.
        bare = {"Authorization": ""}
        assert (await a.request("tools/call", STATS, headers=bare)).status_code == 200

        # A rotate on B: on A the old id answers with the new one, and no longer stands for
        # the key without the credential (a retired id works only with it).
        rotated = await b.tool("session_rotate", {"reason": "user_request"})
        new_id = rotated["result"]["structuredContent"]["newSessionId"]
        old = await a.request("tools/call", STATS)
        assert old.status_code == 200 and old.headers["mcp-session-id"] == new_id
        assert (await a.request("tools/call", STATS, headers=bare)).status_code == 401
        a.session_id = b.session_id = new_id
        assert "result" in await a.rpc("tools/call", STATS)

        # A mode set on B: A lists the tools of that mode.
        await b.initialize({"mode": "audit"}, session_id=a.session_id)
        listed = {t["name"] for t in (await a.rpc("tools/list"))["result"]["tools"]}
        assert "memory_stats" in listed and "remember" not in listed

        # A DELETE on B: A answers 404 at once.
        assert (await b.delete()).status_code == 200
        assert (await a.request("tools/call", STATS)).status_code == 404
