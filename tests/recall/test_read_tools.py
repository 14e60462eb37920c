"""The read tools besides recall, and tenant isolation of every read tool."""

from __future__ import annotations

import asyncpg
import pytest
from mcp.shared.exceptions import MCPError

from shared.db import SEARCH_PATH
from tests.support import Stack, call, create_api_key, mcp_session, unique


async def test_context_core_working_memory_and_seen(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        pref = await call(s, "remember", {"content": "The user prefers answers in Korean with code in English.", "topic": "style", "type": "preference", "workspace": ws})
        proc = await call(s, "remember", {"content": "Deploy with make release then tag the commit.", "topic": "release", "type": "procedure", "workspace": ws})
        fact = await call(s, "remember", {"content": "The CI runners have 4 GB of memory each.", "topic": "ci", "type": "fact", "workspace": ws})
        work = await call(s, "remember", {"content": "Currently refactoring the auth middleware in this session.", "topic": "wip", "type": "fact", "workspace": ws, "scope": "session"})
        loaded = await call(s, "context", {"workspace": ws})
        ids = {f["id"] for f in loaded["fragments"]}
        assert {pref["id"], proc["id"]} <= ids and fact["id"] not in ids
        assert work["id"] in ids, "the session's working memory is loaded"
        assert loaded["totalTokens"] <= 2000 and "searchEventId" in loaded["_meta"] and "serverTime" in loaded["_meta"]
        typed = await call(s, "context", {"workspace": ws, "types": ["fact"], "tokenBudget": 5000})
        assert fact["id"] in {f["id"] for f in typed["fragments"]}
        tree = await call(s, "context", {"workspace": ws, "structured": True})
        assert tree["structured"] is True and pref["id"] in {f["id"] for f in tree["tree"]["core"]["preference"]}
        # excludeSeen (default true): what context() injected is not repeated by recall
        seen = await call(s, "recall", {"text": "user prefers answers in Korean", "workspace": ws})
        assert pref["id"] not in {f["id"] for f in seen["fragments"]}
        unseen = await call(s, "recall", {"text": "user prefers answers in Korean", "workspace": ws, "excludeSeen": False})
        assert pref["id"] in {f["id"] for f in unseen["fragments"]}
        with pytest.raises(MCPError) as err:
            await s.call_tool("context", {"types": ["gossip"]})
        assert err.value.error.code == -32602 and "types" in err.value.error.message


async def test_search_traces_both_spellings(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        e = await call(s, "remember", {"content": "OOMKilled on the indexer pod after 2 hours.", "topic": "k8s-indexer", "type": "error", "workspace": ws, "caseId": "case-oom"})
        await call(s, "remember", {"content": "Indexer memory limit raised to 4Gi.", "topic": "k8s-indexer", "type": "decision", "workspace": ws, "caseId": "case-oom"})
        for args in ({"event_type": "error"}, {"eventType": "error"}, {"keyword": "OOMKilled"}, {"entity_key": "indexer", "event_type": "error"},
                     {"entityKey": "indexer", "eventType": "error"}, {"case_id": "case-oom", "event_type": "error"}, {"caseId": "case-oom", "eventType": "error"}):
            got = await call(s, "search_traces", {**args, "workspace": ws})
            assert [t["id"] for t in got["traces"]] == [e["id"]], args
        assert (await call(s, "search_traces", {"time_range": {"from": "2000-01-01T00:00:00Z", "to": "2000-01-02T00:00:00Z"}, "workspace": ws}))["count"] == 0
        assert (await call(s, "search_traces", {"workspace": ws, "limit": 1}))["count"] == 1
        with pytest.raises(MCPError) as err:
            await s.call_tool("search_traces", {"limit": 101})
        assert err.value.error.code == -32602 and "limit" in err.value.error.message


async def test_reconstruct_history_graph_explore_fragment_history(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws, case = unique(), unique("case")
    async with mcp_session(mcp_url, key) as s:
        cause = await call(s, "remember", {"content": "A config push removed the upstream block from nginx.", "topic": "nginx", "type": "fact", "workspace": ws, "caseId": case, "agentId": "agent-1"})
        err = await call(s, "remember", {"content": "nginx answers 502 for every checkout request.", "topic": "nginx", "type": "error", "workspace": ws, "caseId": case, "agentId": "agent-2"})
        fix = await call(s, "remember", {"content": "Restored the upstream block and reloaded nginx.", "topic": "nginx", "type": "procedure", "workspace": ws, "caseId": case})
        other = await call(s, "remember", {"content": "Checkout also logs a TLS warning nobody has looked at.", "topic": "nginx", "type": "error", "workspace": ws, "caseId": case})
        await call(s, "link", {"fromId": err["id"], "toId": cause["id"], "relationType": "caused_by"})
        await call(s, "link", {"fromId": err["id"], "toId": fix["id"], "relationType": "resolved_by"})
        history = await call(s, "reconstruct_history", {"caseId": case})
        timeline = history["ordered_timeline"]
        assert [t["id"] for t in timeline] == [cause["id"], err["id"], fix["id"], other["id"]]
        assert [t["agent_id"] for t in timeline[:2]] == ["agent-1", "agent-2"]
        chain_ids = {f["id"] for f in history["causal_chains"][0]["fragments"]}
        assert chain_ids == {cause["id"], err["id"], fix["id"]}
        assert [b["id"] for b in history["unresolved_branches"]] == [other["id"]]
        assert (await call(s, "reconstruct_history", {"caseId": case, "limit": 2}))["count"] == 2
        with pytest.raises(MCPError) as bad:
            await s.call_tool("reconstruct_history", {"caseId": case, "limit": 501})
        assert bad.value.error.code == -32602 and "limit" in bad.value.error.message
        rca = await call(s, "graph_explore", {"startId": err["id"]})
        assert [c["id"] for c in rca["rootCauses"]] == [cause["id"]]
        assert [r["id"] for r in rca["resolutions"]] == [fix["id"]]
        assert [c["id"] for c in rca["chain"]] == [cause["id"], err["id"], fix["id"]]
        await call(s, "amend", {"id": fix["id"], "content": "Restored the upstream block, reloaded nginx and added a config lint."})
        newer = await call(s, "remember", {"content": "Checkout TLS warning was a stale intermediate certificate.", "topic": "nginx", "type": "fact", "workspace": ws, "supersedes": [other["id"]]})
        versions = await call(s, "fragment_history", {"id": fix["id"]})
        assert versions["versions"][0]["content"] == "Restored the upstream block and reloaded nginx."
        assert versions["current"]["content"].endswith("added a config lint.")
        chain = await call(s, "fragment_history", {"id": other["id"]})
        assert [c["id"] for c in chain["superseded_by_chain"]] == [newer["id"]]
        missing = await s.call_tool("graph_explore", {"startId": "frag-doesnotexist"})
        assert missing.is_error is True


async def test_memory_stats_blocks_and_tool_feedback(stack: Stack, mcp_url: str) -> None:
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        a = await call(s, "remember", {"content": "The search cluster runs OpenSearch 2.13.", "topic": "search", "type": "fact", "workspace": ws})
        await call(s, "remember", {"content": "Nobody remembers why the cron runs at 03:17.", "topic": "cron", "type": "fact"})
        found = await call(s, "recall", {"text": "which OpenSearch version", "workspace": ws})
        before = found["fragments"][0]["ema_activation"]
        fb = await call(s, "tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True,
                                             "search_event_id": found["_meta"]["searchEventId"], "fragment_ids": [a["id"]],
                                             "suggestion": "x" * 300})
        assert fb["success"] is True and fb["adjustedFragments"] == 1
        await call(s, "tool_feedback", {"tool_name": "recall", "relevant": False, "sufficient": False, "irrelevance_reason": "search_miss"})
        await call(s, "tool_feedback", {"tool_name": "recall", "relevant": False, "sufficient": False, "irrelevance_reason": "bogus"})
        stats = (await call(s, "memory_stats", {}))["stats"]
        ev = stats["evaluation"]
        assert set(ev) >= {"rolling_precision_at_5", "sufficient_rate", "sample_sessions", "task_success_rate", "task_sessions",
                           "task_completed_rate", "task_outcome_reported", "task_outcome_counts", "irrelevance_breakdown"}
        assert ev["sufficient_rate"] == pytest.approx(1 / 3, abs=1e-3) and ev["sample_sessions"] == 1
        assert ev["rolling_precision_at_5"] is not None
        assert ev["irrelevance_breakdown"]["total_irrelevant"] == 2
        assert ev["irrelevance_breakdown"]["counts"]["search_miss"] == 1 and ev["irrelevance_breakdown"]["counts"]["unreported"] == 1
        wsb = stats["workspaces"]
        assert wsb["distribution"]["null_count"] == 1 and wsb["distribution"]["distinct_count"] == 1
        assert wsb["key_fill_rate"] == [{"key_id": key_id, "key_name": wsb["key_fill_rate"][0]["key_name"], "total": 2, "with_workspace": 1, "fill_rate": 0.5}]
        assert set(wsb["session_fragment_distribution"]) == {"p50", "p90", "max", "sample_sessions"}
        assert stats["totalFragments"] == 2
        again = await call(s, "recall", {"text": "which OpenSearch version", "workspace": ws, "excludeSeen": False})
        assert again["fragments"][0]["ema_activation"] > before
        with pytest.raises(MCPError) as err:
            await s.call_tool("tool_feedback", {"tool_name": "recall", "relevant": "perhaps", "sufficient": True})
        assert err.value.error.code == -32602 and "relevant" in err.value.error.message


async def test_every_read_tool_is_tenant_isolated(stack: Stack, mcp_url: str) -> None:
    key_a, _ = await create_api_key(stack.database_url)
    key_b, _ = await create_api_key(stack.database_url)
    marker, case = unique("isolate"), unique("case")
    async with mcp_session(mcp_url, key_a) as a:
        secret = await call(a, "remember", {"content": f"Tenant A secret {marker}: the vault unseal key is in the red binder.", "topic": f"vault-{marker}", "type": "error", "caseId": case})
        await call(a, "recall", {"keywords": [marker]})  # warm A's cache entry
    async with mcp_session(mcp_url, key_b) as b:
        mine = await call(b, "remember", {"content": f"Tenant B note {marker}: the vault is audited monthly.", "topic": "vault", "type": "error", "caseId": case})
        # a link that crosses tenants (as a buggy writer could leave) must not leak either
        conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
        try:
            await conn.execute("INSERT INTO fragment_links (from_id, to_id, relation_type) VALUES ($1, $2, 'caused_by')", mine["id"], secret["id"])
        finally:
            await conn.close()
        responses = [
            await call(b, "recall", {"keywords": [marker], "includeContext": True, "caseMode": True, "tokenBudget": 20000}),
            await call(b, "recall", {"text": f"vault unseal key red binder {marker}", "tokenBudget": 20000}),
            await call(b, "recall", {"topic": f"vault-{marker}"}),
            await call(b, "context", {"types": ["error"], "tokenBudget": 20000}),
            await call(b, "search_traces", {"keyword": marker}),
            await call(b, "reconstruct_history", {"caseId": case}),
            await call(b, "graph_explore", {"startId": mine["id"]}),
            await call(b, "memory_stats", {}),
        ]
        for reply in responses:
            assert secret["id"] not in str(reply) and "red binder" not in str(reply), reply
        assert (await b.call_tool("graph_explore", {"startId": secret["id"]})).is_error is True
        assert (await b.call_tool("fragment_history", {"id": secret["id"]})).is_error is True
        fb = await b.call_tool("tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True, "fragment_ids": [secret["id"]]})
        assert fb.structured_content["adjustedFragments"] == 0
