"""get_skill_guide, the three prompts and the four memory:// resources."""

from __future__ import annotations

import json

import pytest
from mcp.shared.exceptions import MCPError

from shared.contract.gateway import SKILL_SECTIONS
from tests.support import Stack, call, create_api_key, mcp_session, unique

SEED_SECTIONS = ("overview", "lifecycle", "keywords", "search", "episode", "multiplatform", "codex", "tools",
                 "importance", "experiential", "cbr", "triggers", "antipatterns")


async def test_skill_guide_sections(mcp_url: str, master_key: str) -> None:
    assert SKILL_SECTIONS == SEED_SECTIONS
    async with mcp_session(mcp_url, master_key) as s:
        whole = await call(s, "get_skill_guide", {})
        assert whole["sections"] == list(SEED_SECTIONS)
        for name in SEED_SECTIONS:
            assert f"## {name}\n" in whole["content"]
            one = await call(s, "get_skill_guide", {"section": name})
            assert one["section"] == name and one["content"] and one["content"] in whole["content"]
        with pytest.raises(MCPError) as bad:
            await s.call_tool("get_skill_guide", {"section": "nope"})
        assert bad.value.error.code == -32602
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert tools["get_skill_guide"].input_schema["properties"]["section"]["anyOf"][0]["enum"] == list(SEED_SECTIONS)


async def test_prompts(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        prompts = {p.name: p for p in (await s.list_prompts()).prompts}
        assert set(prompts) == {"analyze-session", "retrieve-relevant-memory", "onboarding"}
        assert [a.name for a in prompts["retrieve-relevant-memory"].arguments if a.required] == ["topic"]
        got = await s.get_prompt("retrieve-relevant-memory", {"topic": "nginx 502"})
        text = got.messages[0].content.text
        assert "nginx 502" in text and "recall" in text
        assert "remember" in (await s.get_prompt("analyze-session", {})).messages[0].content.text
        assert "## overview" in (await s.get_prompt("onboarding", {})).messages[0].content.text
        with pytest.raises(MCPError):
            await s.get_prompt("retrieve-relevant-memory", {})
        with pytest.raises(MCPError):
            await s.get_prompt("missing", {})


async def test_resources(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    topic = unique("topic")
    async with mcp_session(stack.mcp_url, raw) as s:
        uris = {str(r.uri) for r in (await s.list_resources()).resources}
        assert uris == {"memory://stats", "memory://topics", "memory://config", "memory://active-session"}
        await call(s, "remember", {"content": "Resources list topics of the caller's own fragments only.", "topic": topic, "type": "fact", "workspace": unique()})

        async def read(uri: str) -> dict:
            return json.loads((await s.read_resource(uri)).contents[0].text)

        stats = await read("memory://stats")
        assert stats["stats"]["totalFragments"] == 1
        topics = [t["topic"] for t in (await read("memory://topics"))["topics"]]
        assert topics == [topic]  # another tenant's topics never show
        config = await read("memory://config")
        assert config["limits"]["maxBodyBytes"] == 1024 * 1024 and "recall-only" in config["modes"]
        active = await read("memory://active-session")
        assert active["keyId"] == key_id and [a["tool"] for a in active["activity"]] == ["remember"]
        assert active["segmentId"] == f"{active['sessionId']}#1"
    writer, _ = await create_api_key(stack.database_url, permissions=["write"])
    async with mcp_session(stack.mcp_url, writer) as s:
        with pytest.raises(MCPError) as denied:
            await s.read_resource("memory://topics")
        assert denied.value.error.message == "Internal error"
