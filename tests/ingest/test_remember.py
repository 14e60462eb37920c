"""remember: every parameter, default, limit and error of the reference, end to end."""

from __future__ import annotations

import asyncio

from tests.ingest.helpers import db, fragment, principal_of, remember_while_key_locked, rpc_error
from tests.support import call, create_api_key, mcp_session, unique


async def test_remember_stores_every_parameter(stack, mcp_url: str, master_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, master_key) as s:
        reply = await call(s, "remember", {
            "content": "The nginx upstream port moved from 8080 to 15001, which fixed the 502 errors.",
            "topic": "nginx", "type": "error", "keywords": ["Upstream", "port-change", "upstream"],
            "importance": 0.9, "source": "unit-test", "scope": "permanent", "isAnchor": True,
            "contextSummary": "Debugging the staging gateway after the migration.",
            "sessionId": "sess-explicit", "caseId": "case-nginx", "goal": "fix 502", "outcome": "port fixed",
            "phase": "debugging", "resolutionStatus": "resolved", "assertionStatus": "verified",
            "affect": "satisfaction", "workspace": ws, "agentId": "agent-7",
        })
    assert reply["success"] is True and reply["ttl_tier"] == "permanent" and reply["scope"] == "permanent"
    assert reply["conflicts"] == [] and "validation_warnings" not in reply
    # seed: given keywords first (deduplicated), then the extracted ones, at most 10.
    assert reply["keywords"][:2] == ["upstream", "port-change"] and len(reply["keywords"]) <= 10
    row = await fragment(stack.database_url, reply["id"])
    assert abs(row["importance"] - 0.9) < 1e-6 and row["is_anchor"] is True and row["source"] == "unit-test"
    assert row["context_summary"] == "Debugging the staging gateway after the migration."
    assert (row["session_id"], row["case_id"], row["goal"], row["outcome"], row["phase"]) == (
        "sess-explicit", "case-nginx", "fix 502", "port fixed", "debugging")
    assert (row["resolution_status"], row["assertion_status"], row["affect"]) == ("resolved", "verified", "satisfaction")
    assert (row["workspace"], row["workspace_source"], row["agent_id"]) == (ws, "explicit", "agent-7")
    assert row["embedding"] is not None


async def test_defaults_importance_scope_case_and_truncation(stack, mcp_url: str, master_key: str) -> None:
    ws = unique()
    expected = {"error": 0.8, "decision": 0.75, "procedure": 0.7, "preference": 0.65, "fact": 0.5, "relation": 0.5, "episode": 0.4}
    long_text = "A deliberately long note about the deployment pipeline. " * 10
    async with mcp_session(mcp_url, master_key) as s:
        ids = {}
        for ftype in expected:
            # The type leads: cut at 300, a shared prefix would be one content (stored once).
            ids[ftype] = (await call(s, "remember", {"content": f"({ftype}) {long_text.strip()}", "topic": "defaults", "type": ftype, "workspace": ws}))["id"]
        session = await call(s, "remember", {"content": "Working memory: the current branch is feature/login.", "topic": "wm", "type": "fact", "scope": "session", "workspace": ws})
    assert session["scope"] == "session" and session["ttl_tier"] == "hot"
    for ftype, fid in ids.items():
        row = await fragment(stack.database_url, fid)
        assert abs(row["importance"] - expected[ftype]) < 1e-6, ftype
        assert row["assertion_status"] == "observed" and row["affect"] == "neutral" and row["ttl_tier"] == "warm"
        # seed: every type but episode is cut at 300 characters.
        assert len(row["content"]) == (len(f"({ftype}) {long_text.strip()}") if ftype == "episode" else 300)
    row = await fragment(stack.database_url, session["id"])
    # seed: caseId defaults to the session (the MCP session id here).
    assert row["session_id"] and row["case_id"] == row["session_id"]


async def test_enums_and_limits_are_invalid_params(mcp_url: str, master_key: str) -> None:
    base = {"content": "A perfectly valid fragment of content.", "topic": "t", "type": "fact"}
    async with mcp_session(mcp_url, master_key) as s:
        for field, value in [("type", "note"), ("scope", "forever"), ("affect", "angry"), ("assertionStatus", "maybe"),
                             ("resolutionStatus", "done"), ("importance", 1.5), ("idempotencyKey", "k" * 129)]:
            err = await rpc_error(s, "remember", {**base, field: value})
            assert err.code == -32602 and field in err.message, (field, err.message)
        err = await rpc_error(s, "remember", {**base, "content": "too short"})
        assert err.code == -32602 and err.message == "Content too short: length < 10 and word count < 3"
        err = await rpc_error(s, "remember", {"topic": "t", "type": "fact"})
        assert err.code == -32602 and "content" in err.message


async def test_workspace_sources_and_not_allowed_warning(stack, mcp_url: str) -> None:
    raw, _ = await create_api_key(stack.database_url, default_workspace="home-ws", allowed_workspaces=["home-ws", "other-ws"])
    bare, _ = await create_api_key(stack.database_url)
    text = "Staging deploys need a green smoke test first."
    async with mcp_session(mcp_url, raw) as s:
        default = await call(s, "remember", {"content": text, "topic": "deploy", "type": "procedure"})
        explicit = await call(s, "remember", {"content": text + " (explicit)", "topic": "deploy", "type": "procedure", "workspace": "other-ws"})
        outside = await call(s, "remember", {"content": text + " (outside)", "topic": "deploy", "type": "procedure", "workspace": "elsewhere"})
    async with mcp_session(mcp_url, bare) as s:
        unscoped = await call(s, "remember", {"content": text, "topic": "deploy", "type": "procedure"})
    assert "validation_warnings" not in default and "validation_warnings" not in explicit
    # seed: workspaceNotAllowed is a pure warning: stored anyway.
    assert outside["success"] is True and outside["validation_warnings"] == ["workspaceNotAllowed"]
    rows = {k: await fragment(stack.database_url, v["id"]) for k, v in
            {"default": default, "explicit": explicit, "outside": outside, "unscoped": unscoped}.items()}
    assert (rows["default"]["workspace"], rows["default"]["workspace_source"]) == ("home-ws", "key_default")
    assert (rows["explicit"]["workspace"], rows["explicit"]["workspace_source"]) == ("other-ws", "explicit")
    assert (rows["unscoped"]["workspace"], rows["unscoped"]["workspace_source"]) == (None, "unscoped")


async def test_idempotency_key_per_key(stack, mcp_url: str, master_key: str) -> None:
    other, _ = await create_api_key(stack.database_url)
    key = unique("idem")
    args = {"content": "nginx upstream 포트를 8080에서 15001로 변경하여 502 해결", "topic": "nginx", "type": "procedure",
            "importance": 0.8, "idempotencyKey": key, "workspace": unique()}
    async with mcp_session(mcp_url, master_key) as s:
        first = await call(s, "remember", args)
        again = await call(s, "remember", args)
        concurrent = await asyncio.gather(*(call(s, "remember", {**args, "idempotencyKey": key + "-c"}) for _ in range(4)))
    assert again == {"success": True, "id": first["id"], "idempotent": True}
    assert len({r["id"] for r in concurrent}) == 1
    async with mcp_session(mcp_url, other) as s:
        theirs = await call(s, "remember", args)
    assert theirs["id"] != first["id"] and "idempotent" not in theirs


async def test_dry_run_simulates_without_storing(stack, mcp_url: str) -> None:
    raw, key_id = await create_api_key(stack.database_url, fragment_limit=50)
    ws = unique()
    text = "Redis Sentinel 연결 실패 — REDIS_SENTINEL_ENABLED 미설정"
    async with mcp_session(mcp_url, raw) as s:
        stored = await call(s, "remember", {"content": text, "topic": "redis", "type": "error", "workspace": ws})
        dry = await call(s, "remember", {"content": text + ".", "topic": "redis", "type": "error", "workspace": ws, "dryRun": True})
    assert dry["dryRun"] is True and set(dry) == {"dryRun", "simulated"}
    sim = dry["simulated"]
    assert sim["fragment"]["content"] == text + "." and sim["fragment"]["type"] == "error" and sim["fragment"]["topic"] == "redis"
    assert [c["id"] for c in sim["conflicts"]] == [stored["id"]]
    assert sim["validation_warnings"] == []
    assert sim["quota"] == {"used": 1, "limit": 50, "remaining": 48}
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1", key_id) == 1


async def test_default_remember_checks_quota_without_the_key_lock(stack) -> None:
    """seed: MEMENTO_REMEMBER_ATOMIC defaults to false — remember checks the quota before its
    write and does not wait for the key's row lock (the atomic path is tested with the flag
    on in test_flags_and_queue.py); the limit still refuses once it is reached."""
    raw, key_id = await create_api_key(stack.database_url, fragment_limit=1)
    waited, reply = await remember_while_key_locked(stack, raw, key_id, f"Plain quota probe {unique()} beside the key lock.")
    assert waited is False
    assert reply["success"] is True and reply["quota"] == {"used": 1, "limit": 1, "remaining": 0}
    waited, over = await remember_while_key_locked(stack, raw, key_id, f"Second quota probe {unique()} past the limit.")
    assert waited is False
    assert over["success"] is False and over["error"] == "fragment_limit_exceeded"
    assert over["quota"] == {"used": 1, "limit": 1, "remaining": -1}


async def test_supersedes_links_and_conflicts(stack, mcp_url: str, master_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, master_key) as s:
        old = await call(s, "remember", {"content": "The API rate limit is 100 requests per minute per key.", "topic": "limits", "type": "fact", "workspace": ws, "importance": 0.6})
        other = await call(s, "remember", {"content": "Rate limits are enforced at the gateway with Redis counters.", "topic": "limits", "type": "fact", "workspace": ws})
        new = await call(s, "remember", {"content": "The API rate limit is now 300 requests per minute per key.", "topic": "limits", "type": "fact",
                                          "workspace": ws, "supersedes": [old["id"]], "linkedTo": [other["id"], "frag-does-not-exist"]})
        dup = await call(s, "remember", {"content": "Rate limits are enforced at the gateway with Redis counters!", "topic": "limits", "type": "fact", "workspace": ws})
    assert new["superseded"] == [old["id"]] and new["linked"] == [other["id"]]
    assert [c["id"] for c in dup["conflicts"]] == [other["id"]] and dup["conflicts"][0]["similarity"] >= 0.92
    row = await fragment(stack.database_url, old["id"])
    assert row["valid_to"] is not None and abs(row["importance"] - 0.3) < 1e-6 and row["superseded_by"] == new["id"]
    async with db(stack.database_url) as conn:
        links = {(r["from_id"], r["to_id"], r["relation_type"]) for r in await conn.fetch(
            "SELECT * FROM fragment_links WHERE from_id = ANY($1::text[])", [old["id"], new["id"]])}
    assert (old["id"], new["id"], "superseded_by") in links and (new["id"], other["id"], "related") in links


async def test_read_your_writes(mcp_url: str, master_key: str) -> None:
    ws = unique()
    marker = unique("okapi")
    async with mcp_session(mcp_url, master_key) as s:
        stored = await call(s, "remember", {"content": f"The {marker} service owns invoice rendering.", "topic": "owners", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"text": "who renders invoices", "workspace": ws})
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": text, "topic": "owners", "type": "fact"} for text in (
                f"The {marker} ledger closes at midnight UTC every day.",
                f"Invoices handled by {marker} are archived after seven years.",
                f"The {marker} dashboard shows revenue per sales region.")]})
        by_kw = await call(s, "recall", {"keywords": [marker], "workspace": ws, "pageSize": 10})
    assert found["fragments"][0]["id"] == stored["id"]
    assert {r["id"] for r in batch["results"]} <= {f["id"] for f in by_kw["fragments"]}


async def test_a_write_for_a_key_deleted_after_authentication_is_unauthorized_not_a_500(stack) -> None:
    # A gateway replica without Redis may hold a deleted key's principal for its cache lifetime;
    # the write it forwards then misses its api_keys row.
    import httpx

    raw, key_id = await create_api_key(stack.database_url)
    principal = await principal_of(stack.database_url, raw)
    async with db(stack.database_url) as conn:
        await conn.execute("DELETE FROM api_keys WHERE id = $1", key_id)
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{stack.ingest_url}/v1/tools/remember",
            json={"arguments": {"content": "Written after the key was deleted.", "topic": "ops", "type": "fact"},
                  "principal": principal, "session": None},
            headers={"x-engram-service-token": stack.service_token},
        )
    assert response.status_code == 401
    assert response.json()["error"] == {"code": -32001, "message": "Unauthorized: this API key has been deleted"}
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1", key_id) == 0
