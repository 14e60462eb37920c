"""recall: layers, fusion, every parameter of the seed's table, and -32602 naming the parameter."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError

from tests.support import Stack, call, create_api_key, mcp_session, unique


async def _store(s, ws: str, items: list[dict]) -> list[str]:  # type: ignore[no-untyped-def]
    reply = await call(s, "batch_remember", {"workspace": ws, "fragments": items})
    return [r["id"] for r in reply["results"]]


async def test_text_uses_lexical_and_semantic_layers(stack: Stack, mcp_url: str) -> None:
    ws = unique()
    key, _ = await create_api_key(stack.database_url, name=(key_name := unique("key")))
    async with mcp_session(mcp_url, key) as s:
        ids = await _store(s, ws, [
            {"content": "The billing service retries failed Stripe charges three times.", "topic": "billing", "type": "fact"},
            {"content": "Our on-call rotation hands over every Monday at 10:00.", "topic": "oncall", "type": "fact"},
            {"content": "Payment attempts that fail are tried again up to three times.", "topic": "billing", "type": "fact"},
        ])
        found = await call(s, "recall", {"text": "how often are failed Stripe charges retried", "workspace": ws})
        assert found["fragments"][0]["id"] == ids[0]
        assert "L2:" in found["searchPath"] and "L3:" in found["searchPath"]
        # keywords alone still get the semantic fallback (L3kw) the seed describes
        kw = await call(s, "recall", {"keywords": ["payment"], "workspace": ws})
        assert "L3kw:" in kw["searchPath"]
        assert ids[2] in [f["id"] for f in kw["fragments"]]


async def test_korean_particles_do_not_block_matches(stack: Stack, mcp_url: str) -> None:
    ws = unique()
    key, _ = await create_api_key(stack.database_url, name=(key_name := unique("key")))
    async with mcp_session(mcp_url, key) as s:
        ids = await _store(s, ws, [
            {"content": "배포 서버가 새벽마다 재시작된다.", "topic": "deploy", "type": "fact"},
            {"content": "점심 메뉴는 김치찌개였다.", "topic": "lunch", "type": "fact"},
        ])
        stored = await call(s, "recall", {"keywords": ["서버"], "workspace": ws, "includeKeywords": True, "pageSize": 1})
        assert stored["fragments"][0]["id"] == ids[0]
        assert "서버" in stored["fragments"][0]["keywords"] and "서버가" not in stored["fragments"][0]["keywords"]
        found = await call(s, "recall", {"text": "서버를 재시작", "workspace": ws, "pageSize": 1})
        assert found["fragments"][0]["id"] == ids[0]


async def test_neighbouring_turns_and_include_context(stack: Stack, mcp_url: str) -> None:
    ws = unique()
    key, _ = await create_api_key(stack.database_url, name=(key_name := unique("key")))
    async with mcp_session(mcp_url, key) as s:
        ids = await _store(s, ws, [
            {"content": "Alice: I finally adopted a dog last weekend.", "topic": "chat", "type": "episode"},
            {"content": "Bob: What breed is it?", "topic": "chat", "type": "episode"},
            {"content": "Alice: A golden retriever named Max.", "topic": "chat", "type": "episode"},
            {"content": "Bob: The weather was terrible on Sunday.", "topic": "chat", "type": "episode"},
        ])
        found = await call(s, "recall", {"text": "what breed is Alice's dog", "workspace": ws, "includeContext": True, "tokenBudget": 5000})
        top = found["fragments"][0]
        assert top["id"] in ids[:3]
        assert top["nearby_context"], "includeContext gives the turns around a hit"
        stitched = [f for f in found["fragments"] if "stitched_context" in f]
        assert 1 <= len(stitched) <= 3
        assert {"target", "pre", "post", "causal"} <= set(stitched[0]["stitched_context"])


async def test_filters(stack: Stack, mcp_url: str) -> None:
    # A tenant of its own: the master key would also see every other test's global fragments.
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        err = await call(s, "remember", {"content": "Kafka consumer lag alert fired for the orders topic.", "topic": "kafka", "type": "error",
                                          "workspace": ws, "importance": 0.9, "affect": "frustration", "caseId": "case-k", "phase": "debugging",
                                          "resolutionStatus": "open", "isAnchor": True, "agentId": "agent-a"})
        fact = await call(s, "remember", {"content": "Kafka orders topic has twelve partitions.", "topic": "kafka-facts", "type": "fact",
                                           "workspace": ws, "importance": 0.3, "agentId": "agent-b"})
        glob = await call(s, "remember", {"content": "Kafka brokers run version 3.7 everywhere.", "topic": "kafka-global", "type": "fact"})
        q = {"text": "kafka orders", "workspace": ws, "pageSize": 50}

        async def ids(**extra):  # type: ignore[no-untyped-def]
            return {f["id"] for f in (await call(s, "recall", {**q, **extra}))["fragments"]}

        assert await ids(type="error") == {err["id"]}
        assert await ids(topic="kafka-facts") == {fact["id"]}
        assert await ids(minImportance=0.85) == {err["id"]}
        assert await ids(isAnchor=True) == {err["id"]}
        assert await ids(affect="frustration") == {err["id"]}
        assert await ids(affect=["frustration", "doubt"]) == {err["id"]}
        assert await ids(caseId="case-k") == {err["id"]}
        assert await ids(resolutionStatus="open") == {err["id"]}
        assert await ids(phase="debugging") == {err["id"]}
        assert await ids(depth="high-level") == set()
        assert fact["id"] in await ids(depth="tool-level")
        assert await ids(agentId="agent-b") & {err["id"], fact["id"]} == {fact["id"]}
        assert {err["id"], fact["id"]} <= await ids(agentId="agent-b", includePeerAgents=True)
        # workspace = that workspace plus global (NULL) fragments
        assert glob["id"] in await ids()
        other = await ids(workspace=unique())
        assert glob["id"] in other and not other & {err["id"], fact["id"]}
        # threshold bounds the similarity of what only the vector layer found (0 lets it all
        # through); without one, the relevance floor answers a word stored nowhere with nothing
        loose = await call(s, "recall", {"keywords": ["zeppelin"], "workspace": ws, "threshold": 0})
        strict = await call(s, "recall", {"keywords": ["zeppelin"], "workspace": ws, "threshold": 0.99})
        default = await call(s, "recall", {"keywords": ["zeppelin"], "workspace": ws})
        assert loose["count"] > 0 and strict["count"] == 0 and default["count"] == 0
        assert await ids(timeRange={"from": "2000-01-01T00:00:00Z", "to": "2000-01-02T00:00:00Z"}) == set()
        assert err["id"] in await ids(timeRange={"from": "today"})
        assert err["id"] in await ids(timeRange={"from": "last 7 days"})
        assert err["id"] in await ids(asOf="2999-01-01T00:00:00Z")
        assert await ids(asOf="2000-01-01T00:00:00Z") == set()


async def test_superseded_and_fields_and_keyname(stack: Stack, mcp_url: str) -> None:
    ws = unique()
    key, _ = await create_api_key(stack.database_url, name=(key_name := unique("key")))
    async with mcp_session(mcp_url, key) as s:
        old = await call(s, "remember", {"content": "The staging database lives on db-stage-1.", "topic": "db", "type": "fact", "workspace": ws})
        new = await call(s, "remember", {"content": "The staging database moved to db-stage-2.", "topic": "db", "type": "fact",
                                          "workspace": ws, "supersedes": [old["id"]]})
        base = {"text": "staging database host", "workspace": ws}
        assert old["id"] not in {f["id"] for f in (await call(s, "recall", base))["fragments"]}
        assert old["id"] in {f["id"] for f in (await call(s, "recall", {**base, "includeSuperseded": True}))["fragments"]}
        sparse = await call(s, "recall", {**base, "fields": ["id", "importance"]})
        assert all(set(f) == {"id", "importance"} for f in sparse["fragments"])
        named = await call(s, "recall", {**base, "includeKeyName": True, "includeKeywords": True})
        assert named["fragments"][0]["key_name"] == key_name and "key_id" in named["fragments"][0]
        assert "keywords" in named["fragments"][0]
        assert "keywords" not in (await call(s, "recall", base))["fragments"][0]
        assert new["id"] == (await call(s, "recall", base))["fragments"][0]["id"]


async def test_links_case_mode_and_pagination(stack: Stack, mcp_url: str) -> None:
    ws = unique()
    key, _ = await create_api_key(stack.database_url, name=(key_name := unique("key")))
    async with mcp_session(mcp_url, key) as s:
        err = await call(s, "remember", {"content": "nginx returns 502 Bad Gateway on the checkout route.", "topic": "nginx", "type": "error",
                                          "workspace": ws, "caseId": "case-502", "goal": "fix the 502"})
        fix = await call(s, "remember", {"content": "Pointed the nginx upstream at port 15001 which fixed the 502.", "topic": "nginx",
                                          "type": "procedure", "workspace": ws, "caseId": "case-502"})
        await call(s, "link", {"fromId": err["id"], "toId": fix["id"], "relationType": "resolved_by"})
        found = await call(s, "recall", {"text": "nginx 502 checkout", "workspace": ws, "type": "error"})
        linked = found["fragments"][0]["linked"]
        assert linked[0]["id"] == fix["id"] and linked[0]["relation_type"] == "resolved_by"
        only = await call(s, "recall", {"text": "nginx 502 checkout", "workspace": ws, "type": "error", "linkRelationType": "caused_by"})
        assert only["fragments"][0]["linked"] == []
        none = await call(s, "recall", {"text": "nginx 502 checkout", "workspace": ws, "type": "error", "includeLinks": False})
        assert "linked" not in none["fragments"][0]
        cases = await call(s, "recall", {"text": "nginx 502", "workspace": ws, "caseMode": True, "maxCases": 1})
        assert cases["caseMode"] is True and cases["caseCount"] == 1
        case = cases["cases"][0]
        assert case["case_id"] == "case-502" and case["goal"] == "fix the 502"
        assert {"events", "outcome", "resolution_status", "fragment_count", "relevance_score"} <= set(case)
        more = await _store(s, ws, [{"content": f"nginx worker {i} config reload note number {i}.", "topic": "nginx", "type": "fact"} for i in range(6)])
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            page = await call(s, "recall", {"text": "nginx", "workspace": ws, "pageSize": 3, **({"cursor": cursor} if cursor else {})})
            seen.extend(f["id"] for f in page["fragments"])
            if not page["hasMore"]:
                break
            cursor = page["nextCursor"]
        # no page repeats a hit, and paging reaches every fragment of the workspace
        assert len(seen) == len(set(seen))
        assert {err["id"], fix["id"], *more} <= set(seen)


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ({"text": "x", "pageSize": 0}, "pageSize"),
        ({"text": "x", "pageSize": 51}, "pageSize"),
        ({"text": "x", "tokenBudget": 0}, "tokenBudget"),
        ({"text": "x", "threshold": 1.5}, "threshold"),
        ({"text": "x", "type": "gossip"}, "type"),
        ({"text": "x", "depth": "deep"}, "depth"),
        ({"text": "x", "maxCases": 11}, "maxCases"),
        ({"text": "x", "minImportance": -0.1}, "minImportance"),
        ({"text": "x", "affect": "angry"}, "affect"),
        ({"text": "x", "fields": ["id", "secret"]}, "fields"),
        ({"text": "x", "resolutionStatus": "done"}, "resolutionStatus"),
        ({"text": "x", "linkRelationType": "friends"}, "linkRelationType"),
        ({"text": "x", "asOf": "not a date"}, "asOf"),
        ({"text": "x", "timeRange": {"from": "the day the music died"}}, "timeRange.from"),
        ({"text": "x", "cursor": "garbage!"}, "cursor"),
        ({"text": "x", "keywords": "notalist"}, "keywords"),
        ({"text": "x", "includeLinks": "maybe"}, "includeLinks"),
        ({}, "text"),
    ],
)
async def test_bad_values_are_invalid_params_naming_the_parameter(mcp_url: str, master_key: str, arguments: dict, parameter: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        with pytest.raises(MCPError) as err:
            await s.call_tool("recall", arguments)
    assert err.value.error.code == -32602
    assert parameter in err.value.error.message


async def test_lexical_postings_follow_amend_type_change_and_forget(stack: Stack, mcp_url: str) -> None:
    """The lexical layer reads its own inverted index (fragment_terms): every write path
    that changes what a fragment says, or its type, must be seen there at once."""
    ws = unique()
    old_word, new_word = unique("zebrafinch").replace("-", ""), unique("okapimoth").replace("-", "")
    key, _ = await create_api_key(stack.database_url)
    async with mcp_session(mcp_url, key) as s:
        [fid] = await _store(s, ws, [{"content": f"The {old_word} cron purges stale carts.", "topic": "carts", "type": "fact"}])

        async def lexical_hits(word: str, **extra: object) -> str:
            found = await call(s, "recall", {"keywords": [word], "workspace": ws, **extra})
            return found["searchPath"].split(" → ")[0]

        assert await lexical_hits(old_word) == "L2:1"
        await call(s, "amend", {"id": fid, "content": f"The {new_word} cron purges stale carts."})
        assert await lexical_hits(old_word) == "L2:0"
        assert await lexical_hits(new_word) == "L2:1"
        assert await lexical_hits(new_word, type="fact") == "L2:1"
        await call(s, "amend", {"id": fid, "type": "procedure"})
        assert await lexical_hits(new_word, type="fact") == "L2:0"
        assert await lexical_hits(new_word, type="procedure") == "L2:1"
        await call(s, "forget", {"id": fid, "force": True})
        assert await lexical_hits(new_word) == "L2:0"
