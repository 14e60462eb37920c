"""reflect (legacy and per-session groups, task_effectiveness) and tenant isolation of every
write tool."""

from __future__ import annotations

from tests.ingest.helpers import db, fragment, rpc_error, tool_error, wait_job
from tests.support import call, create_api_key, mcp_session, unique


async def test_reflect_legacy_breakdown_and_derived_narrative(stack, mcp_url: str) -> None:
    raw, key_id = await create_api_key(stack.database_url, default_workspace=unique("kd"))
    async with mcp_session(mcp_url, raw) as s:
        reply = await call(s, "reflect", {
            "summary": ["The search index was rebuilt with the new analyser.", "Latency dropped to 40 ms at p95."],
            "decisions": ["Keep the Korean morpheme analyser for every workspace."],
            "errors_resolved": ["원인: stale HNSW parameters → 해결: rebuilt with ef_construction 128."],
            "new_procedures": ["1. Drain traffic 2. Rebuild the index 3. Swap the alias."],
            "open_questions": ["Should the nightly rebuild move to the weekend?"],
            "task_effectiveness": {"outcome": "partial", "evidence": "e" * 1500, "unmet_requirements": [f"req {i} " + "x" * 300 for i in range(25)],
                                   "tool_highlights": ["recall"], "tool_pain_points": ["amend"]},
        })
    assert reply["breakdown"] == {"summary": 2, "decisions": 1, "errors": 1, "procedures": 1, "questions": 1, "episode": 1}
    assert reply["count"] == 7 and "groups" not in reply
    types = [f["type"] for f in reply["fragments"]]
    assert types == ["fact", "fact", "decision", "error", "procedure", "fact", "episode"]
    episode = await fragment(stack.database_url, reply["fragments"][-1]["id"])
    assert episode["content"] == "The search index was rebuilt with the new analyser. Latency dropped to 40 ms at p95."
    assert episode["topic"] == "session_reflect" and episode["workspace_source"] == "key_default"
    async with db(stack.database_url) as conn:
        task = await conn.fetchrow("SELECT * FROM task_feedback WHERE id = $1", reply["task_effectiveness"]["id"])
    assert task["key_id"] == key_id and task["outcome"] == "partial" and task["evaluator"] == "agent"
    assert len(task["evidence"]) == 1000 and len(task["unmet_requirements"]) == 20
    assert all(len(item) == 200 for item in task["unmet_requirements"])
    assert task["overall_success"] is False and task["tool_highlights"] == ["recall"] and task["tool_pain_points"] == ["amend"]


async def test_task_effectiveness_enum_and_derivation(stack, mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        bad = await call(s, "reflect", {"summary": "Nothing much happened in this short session at all.", "workspace": unique(),
                                        "task_effectiveness": {"outcome": "great", "evaluator": "human"}})
        done = await call(s, "reflect", {"task_effectiveness": {"outcome": "completed", "evaluator": "automatic"}})
        explicit = await call(s, "reflect", {"task_effectiveness": {"outcome": "completed", "overall_success": False, "evaluator": "robot"}})
    async with db(stack.database_url) as conn:
        rows = [await conn.fetchrow("SELECT * FROM task_feedback WHERE id = $1", r["task_effectiveness"]["id"]) for r in (bad, done, explicit)]
    # seed: an outcome outside the enum is stored as NULL (and evaluator only with an outcome).
    assert (rows[0]["outcome"], rows[0]["evaluator"], rows[0]["overall_success"]) == (None, None, False)
    assert (rows[1]["outcome"], rows[1]["evaluator"], rows[1]["overall_success"]) == ("completed", "automatic", True)
    assert (rows[2]["overall_success"], rows[2]["evaluator"]) == (False, "agent")
    assert done["count"] == 0 and done["breakdown"]["summary"] == 0


async def test_reflect_session_groups_and_workspace_precedence(stack, mcp_url: str, master_key: str) -> None:
    sid = unique("sess")
    ws_a, ws_b = unique("wa"), unique("wb")
    async with mcp_session(mcp_url, master_key) as s:
        for content, ws, case, topic in [
            ("The payment webhook retries were doubled to six.", ws_a, "case-pay", "payments"),
            ("The webhook secret rotation is scheduled monthly.", ws_a, "case-pay", "payments"),
            ("The docs site moved to a static generator.", ws_b, None, "docs"),
        ]:
            await call(s, "remember", {"content": content, "topic": topic, "type": "fact", "workspace": ws, "sessionId": sid,
                                       **({"caseId": case} if case else {})})
        grouped = await call(s, "reflect", {"sessionId": sid, "summary": ["Payments hardening went well today."],
                                            "decisions": ["Webhook retries stay at six."]})
        forced = await call(s, "reflect", {"sessionId": sid, "workspace": "forced-ws", "summary": ["A second reflection of the same session."]})
    groups = grouped["groups"]
    assert [(g["workspace"], g["caseId"], g["topic"]) for g in groups] == [(ws_a, "case-pay", "payments"), (ws_b, sid, "docs")]
    assert len(groups[0]["fragmentIds"]) == 3 and len(groups[1]["fragmentIds"]) == 1  # summary + decision + episode; synthesised episode
    rows = {fid: await fragment(stack.database_url, fid) for g in groups for fid in g["fragmentIds"]}
    assert {rows[f]["workspace"] for f in groups[0]["fragmentIds"]} == {ws_a}
    assert {rows[f]["case_id"] for f in groups[0]["fragmentIds"]} == {"case-pay"}
    docs = rows[groups[1]["fragmentIds"][0]]
    assert docs["workspace"] == ws_b and docs["type"] == "episode" and "static generator" in docs["content"]
    assert grouped["breakdown"] == {"summary": 1, "decisions": 1, "errors": 0, "procedures": 0, "questions": 0, "episode": 1}
    # seed: an explicit workspace wins over every group's own.
    assert {g["workspace"] for g in forced["groups"]} == {"forced-ws"}
    assert {(await fragment(stack.database_url, f["id"]))["workspace"] for f in forced["fragments"]} == {"forced-ws"}


async def test_reflect_refuses_secrets(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        err = await rpc_error(s, "reflect", {"decisions": ["Use the key AKIAIOSFODNN7EXAMPLE for the uploader."], "workspace": unique()})
    assert err.code == -32602 and "aws_access_key" in err.message and "AKIA" not in err.message


async def test_every_write_tool_is_tenant_isolated(stack, mcp_url: str) -> None:
    alice, _ = await create_api_key(stack.database_url)
    bob, bob_id = await create_api_key(stack.database_url)
    sid = unique("alice-session")
    topic = unique("secret-topic")
    async with mcp_session(mcp_url, alice) as s:
        a1 = (await call(s, "remember", {"content": "Alice's launch date is the third of March.", "topic": topic, "type": "fact", "sessionId": sid}))["id"]
        a2 = (await call(s, "remember", {"content": "Alice's launch venue is the harbour hall.", "topic": topic, "type": "fact", "sessionId": sid}))["id"]
        job = await call(s, "batch_remember", {"fragments": [{"content": "Alice's queued note about the launch.", "topic": topic, "type": "fact"}], "async": True})
        await wait_job(s, job["jobId"])
    async with mcp_session(mcp_url, bob) as s:
        b1 = (await call(s, "remember", {"content": "Bob's own note about his project plan.", "topic": "bob", "type": "fact",
                                          "supersedes": [a1], "linkedTo": [a2]}))
        assert "superseded" not in b1 and "linked" not in b1
        assert await tool_error(s, "forget", {"id": a1}) == {"success": True, "deleted": 0, "error": "Fragment not found or no permission"}
        assert (await call(s, "forget", {"topic": topic, "dryRun": True}))["targets"] == []
        assert (await call(s, "forget", {"topic": topic}))["deleted"] == 0
        assert await tool_error(s, "amend", {"id": a1, "content": "Bob rewrote Alice's memory here."}) == {"success": False, "error": "Fragment not found"}
        assert await tool_error(s, "link", {"fromId": b1["id"], "toId": a1}) == {"success": False, "error": "Fragment not found"}
        assert await tool_error(s, "link", {"fromId": a1, "toId": a2}) == {"success": False, "error": "Fragment not found"}
        assert (await call(s, "link", {"fromId": a1, "toId": a2, "dryRun": True}))["ownership"] == "not_found"
        assert (await tool_error(s, "batch_status", {"jobId": job["jobId"]}))["error"] == "Job not found"
        reflected = await call(s, "reflect", {"sessionId": sid, "summary": ["Bob tries to reflect Alice's session."]})
        assert all("launch" not in f["content"] for f in reflected["fragments"])
        assert [g["topic"] for g in reflected["groups"]] == ["session_reflect"]
        batch = await call(s, "batch_remember", {"fragments": [{"content": "Alice's launch date is the third of March.", "topic": topic, "type": "fact"}]})
        assert "duplicate" not in batch["results"][0]  # content de-duplication is per tenant too
    row = await fragment(stack.database_url, a1)
    assert row is not None and row["valid_to"] is None and row["content"] == "Alice's launch date is the third of March."
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragment_links WHERE key_id = $1 AND (to_id = $2 OR to_id = $3)", bob_id, a1, a2) == 0


async def test_tools_list_has_every_write_tool(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    for name in ("remember", "batch_remember", "batch_status", "forget", "amend", "link", "reflect"):
        assert name in tools and tools[name].meta["riskLevel"] in ("read", "write")
    assert tools["batch_status"].meta["riskLevel"] == "read" and tools["batch_status"].input_schema["required"] == ["jobId"]
    assert tools["amend"].input_schema["required"] == ["id"]
    assert set(tools["link"].input_schema["required"]) == {"fromId", "toId"}
    assert tools["link"].input_schema["properties"]["relationType"]["default"] == "related"
    assert tools["batch_remember"].input_schema["properties"]["async"]["default"] is False
