"""RBAC (seed: -32600 "Internal error", reason only in the log), mode presets, tools/list meta."""

from __future__ import annotations

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from shared.contract.catalog import TOOLS
from tests.gateway.wire import RawMcp
from tests.support import Stack, call, create_api_key, mcp_session, unique

RECALL_ONLY = {"recall", "context", "memory_stats", "graph_explore", "fragment_history", "reconstruct_history", "search_traces", "get_skill_guide", "tool_feedback"}
WRITE_ONLY = {"remember", "batch_remember", "forget", "amend", "link", "reflect"}
AUDIT = {"recall", "context", "memory_stats", "graph_explore", "fragment_history", "reconstruct_history", "search_traces"}
SERVED = {t.name for t in TOOLS}


async def _denials(http: httpx.AsyncClient, stack: Stack, tool: str) -> float:
    text = (await http.get(f"{stack.gateway_url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("mcp_rbac_denied_total{") and f'tool="{tool}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_permission_denied_is_internal_error_with_reason_only_in_the_log(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url, permissions=["read"])
    async with httpx.AsyncClient() as http:
        before = await _denials(http, stack, "remember")
        async with mcp_session(stack.mcp_url, raw) as s:
            with pytest.raises(MCPError) as denied:
                await s.call_tool("remember", {"content": "A read-only key tries to write this.", "topic": "t", "type": "fact"})
            assert denied.value.error.code == -32600
            assert denied.value.error.message == "Internal error"
            assert "Permission" not in str(denied.value.error.data or "")
            # reading is allowed; a tool missing from TOOL_PERMISSIONS needs nothing
            await s.call_tool("recall", {"keywords": ["x"], "workspace": unique()})
            await s.call_tool("get_skill_guide", {"section": "overview"})
        assert await _denials(http, stack, "remember") == before + 1
    log = (stack.log_dir / "gateway.log").read_text()
    assert f"Permission denied: 'remember' requires 'write' permission (key {key_id})" in log


async def test_admin_implies_every_level_and_write_only_cannot_read(stack: Stack) -> None:
    admin_raw, _ = await create_api_key(stack.database_url, permissions=["admin"])
    writer_raw, _ = await create_api_key(stack.database_url, permissions=["write"])
    ws = unique()
    async with mcp_session(stack.mcp_url, admin_raw) as s:
        stored = await call(s, "remember", {"content": "Admin keys can write and read everything here.", "topic": "t", "type": "fact", "workspace": ws})
        assert (await call(s, "recall", {"keywords": ["admin"], "workspace": ws}))["count"] >= 1
    async with mcp_session(stack.mcp_url, writer_raw) as s:
        with pytest.raises(MCPError) as denied:
            await s.call_tool("recall", {"keywords": ["admin"]})
        assert (denied.value.error.code, denied.value.error.message) == (-32600, "Internal error")
        assert stored["success"]


async def _listed(stack: Stack, key: str, headers: dict[str, str] | None = None, params: dict | None = None) -> list[str]:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, key, headers)
        await mcp.initialize(params)
        try:
            return [t["name"] for t in (await mcp.rpc("tools/list"))["result"]["tools"]]
        finally:
            # Ended, so the next initialize of this key does not continue it (and its mode).
            await mcp.delete()


async def test_mode_presets_filter_tools_list(stack: Stack) -> None:
    key = stack.master_key
    assert set(await _listed(stack, key, {"X-Memento-Mode": "recall-only"})) == RECALL_ONLY & SERVED
    assert set(await _listed(stack, key, {"X-Memento-Mode": "write-only"})) == WRITE_ONLY & SERVED
    assert set(await _listed(stack, key, params={"mode": "audit"})) == AUDIT & SERVED
    onboarding = await _listed(stack, key, params={"mode": "onboarding"})
    assert onboarding[0] == "get_skill_guide" and set(onboarding) == SERVED
    assert set(await _listed(stack, key)) == SERVED
    # the header wins over params.mode
    assert set(await _listed(stack, key, {"X-Memento-Mode": "audit"}, {"mode": "write-only"})) == AUDIT & SERVED
    # the key's default_mode applies when the client names none
    raw, _ = await create_api_key(stack.database_url, default_mode="recall-only")
    assert set(await _listed(stack, raw)) == RECALL_ONLY & SERVED


async def test_mode_refuses_tools_outside_it(stack: Stack) -> None:
    async with mcp_session(stack.mcp_url, stack.master_key, headers={"X-Memento-Mode": "recall-only"}) as s:
        with pytest.raises(MCPError) as refused:
            await s.call_tool("remember", {"content": "Recall-only sessions must not store this.", "topic": "t", "type": "fact"})
        assert refused.value.error.code == -32600 and "recall-only" in refused.value.error.message
        await s.call_tool("memory_stats", {})
    async with mcp_session(stack.mcp_url, stack.master_key, headers={"X-Memento-Mode": "write-only"}) as s:
        with pytest.raises(MCPError):
            await s.call_tool("recall", {"keywords": ["x"]})


async def test_tools_list_carries_top_level_meta_on_the_wire(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, stack.master_key)
        await mcp.initialize()
        tools = {t["name"]: t for t in (await mcp.rpc("tools/list"))["result"]["tools"]}
        await mcp.delete()
    assert set(tools) == SERVED
    for spec in TOOLS:
        entry = tools[spec.name]
        assert entry["meta"] == spec.meta() == entry["_meta"]
        assert set(entry["meta"]) == {"capabilities", "riskLevel", "requiresMaster", "beta", "idempotent"}
    assert tools["recall"]["meta"] == {"capabilities": ["search", "pagination", "caseMode"], "riskLevel": "read", "requiresMaster": False, "beta": False, "idempotent": True}
    assert tools["remember"]["meta"]["riskLevel"] == "write" and tools["remember"]["meta"]["idempotent"] is False
