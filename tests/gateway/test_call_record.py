"""A tool call is counted (the key's daily_limit) and recorded in its session's activity in
the round trip in which the front door resolves the session, before the checks that may
still refuse it (services/gateway/core/edge.py). A call those checks refuse did not happen:
it is taken back, so it neither uses up the daily limit nor shows in the session's activity."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.gateway.test_hot_path import admin, new_key
from tests.gateway.wire import RawMcp
from tests.support import Stack

STATS = {"name": "memory_stats", "arguments": {}}


async def _activity(mcp: RawMcp) -> list[str]:
    body = await mcp.rpc("resources/read", {"uri": "memory://active-session"})
    return [a["tool"] for a in json.loads(body["result"]["contents"][0]["text"])["activity"]]


async def _call(mcp: RawMcp, params: dict[str, Any]) -> dict[str, Any]:
    return await mcp.rpc("tools/call", params)


async def test_refused_tool_calls_use_up_no_daily_limit_and_leave_no_activity(stack: Stack) -> None:
    reader = await new_key(stack.gateway_url, stack.master_key, daily_limit=3, permissions=["read"])
    other = await new_key(stack.gateway_url, stack.master_key)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, reader["raw_key"])
        await mcp.initialize()
        stranger = RawMcp(http, stack.mcp_url, other["raw_key"])
        await stranger.initialize()
        # Each key has been seen by this gateway, so its calls are recorded in the front door's round trip.
        assert "result" in await _call(mcp, STATS)
        assert "result" in await _call(mcp, STATS)
        assert "result" in await _call(stranger, STATS)

        # Refused further in: RBAC (a read-only key writing), an unknown tool, bad arguments.
        remember = {"name": "remember", "arguments": {"content": "x", "topic": "t", "type": "fact"}}
        assert (await _call(mcp, remember))["error"]["code"] == -32600
        assert "error" in await _call(mcp, {"name": "no_such_tool", "arguments": {}})
        assert "error" in await _call(mcp, {"name": "memory_stats", "arguments": "not an object"})
        # Refused at the front door: another key's credential on this session.
        foreign = await mcp.request("tools/call", STATS, headers={"Authorization": f"Bearer {other['raw_key']}"})
        assert foreign.status_code == 403

        # The limit is 3: the refused calls took none of it, so the third call passes ...
        assert "result" in await _call(mcp, STATS)
        # ... and the fourth is refused by the limit, as before.
        over = await _call(mcp, STATS)
        assert over["error"]["code"] == -32000 and "Daily limit" in over["error"]["message"]
        assert await _activity(mcp) == ["memory_stats"] * 3
        assert await _activity(stranger) == ["memory_stats"]
    async with admin(stack.gateway_url, stack.master_key) as http_admin:
        listed = {k["id"]: k for k in (await http_admin.get("/keys")).json()}
    assert listed[reader["id"]]["calls_today"] == 4  # three served, one refused by the limit
    assert listed[other["id"]]["calls_today"] == 0  # no daily_limit: not counted
