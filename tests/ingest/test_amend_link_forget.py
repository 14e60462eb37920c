"""amend, link and forget: every field, version rows, case events, cycles, the three forget
replies and dryRun."""

from __future__ import annotations

from tests.ingest.helpers import db, fragment, rpc_error, tool_error
from tests.support import call, mcp_session, unique


async def _remember(s, **fields) -> str:  # type: ignore[no-untyped-def]
    args = {"topic": "amend", "type": "fact", "workspace": fields.pop("workspace", None) or unique(), **fields}
    return (await call(s, "remember", args))["id"]


async def test_amend_every_field_writes_versions(stack, mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        fid = await _remember(s, content="The build cache lives on the shared NFS volume.", keywords=["nfs"])
        before = await call(s, "recall", {"keywords": ["nfs"], "pageSize": 50})
        assert "The build cache lives on the shared NFS volume." in [f["content"] for f in before["fragments"]]
        first = await call(s, "amend", {"id": fid, "content": "The build cache moved to S3 with a 7 day lifecycle rule.",
                                        "topic": "build", "type": "decision", "importance": 0.9, "isAnchor": True,
                                        "phase": "implementation", "outcome": "cache moved"})
        assert first["success"] is True and first["updated"] is True and first["id"] == fid and first["version"] == 1
        assert set(first["changes"]) == {"content", "topic", "type", "importance", "is_anchor", "ttl_tier", "phase", "outcome", "keywords"}
        second = await call(s, "amend", {"id": fid, "keywords": ["s3", "cache"], "assertionStatus": "verified", "isAnchor": False})
        assert second["version"] == 2
        unchanged = await call(s, "amend", {"id": fid, "phase": "implementation"})
        assert unchanged == {"success": True, "updated": False, "id": fid, "changes": []}
        found = await call(s, "recall", {"keywords": ["s3"], "pageSize": 5})
        # The same recall as before the amend is not served from a stale cache.
        after = await call(s, "recall", {"keywords": ["nfs"], "pageSize": 50})
        assert "The build cache lives on the shared NFS volume." not in [f["content"] for f in after["fragments"]]
    row = await fragment(stack.database_url, fid)
    assert row["content"] == "The build cache moved to S3 with a 7 day lifecycle rule."
    assert (row["topic"], row["type"], row["phase"], row["outcome"], row["assertion_status"]) == ("build", "decision", "implementation", "cache moved", "verified")
    assert abs(row["importance"] - 0.9) < 1e-6 and row["is_anchor"] is False and row["ttl_tier"] == "warm"
    assert row["keywords"][:2] == ["s3", "cache"]
    assert fid in [f["id"] for f in found["fragments"]]  # the full-text vector follows the new content
    async with db(stack.database_url) as conn:
        versions = await conn.fetch("SELECT version, content, topic, type FROM fragment_versions WHERE fragment_id = $1 ORDER BY version", fid)
    assert [(v["version"], v["topic"], v["type"]) for v in versions] == [(1, "amend", "fact"), (2, "build", "decision")]
    assert versions[0]["content"] == "The build cache lives on the shared NFS volume."


async def test_amend_case_events_backprop_off_dry_run_and_errors(stack, mcp_url: str, master_key: str) -> None:
    case = unique("case")
    async with mcp_session(mcp_url, master_key) as s:
        fid = await _remember(s, content="Login fails with 502 after the nginx upgrade.", type="error", caseId=case, resolutionStatus="open")
        peer = await _remember(s, content="Suspect the upstream keepalive setting in nginx.", caseId=case, importance=0.5)
        dry = await call(s, "amend", {"id": fid, "resolutionStatus": "resolved", "dryRun": True})
        assert dry["dryRun"] is True and dry["changes"] == ["resolution_status"]
        assert dry["fragment"]["resolution_status"] == "resolved" and dry["before"]["resolution_status"] == "open"
        assert (await fragment(stack.database_url, fid))["resolution_status"] == "open"
        verified = await call(s, "amend", {"id": fid, "assertionStatus": "verified"})
        rejected = await call(s, "amend", {"id": fid, "assertionStatus": "rejected"})
        closed = await call(s, "amend", {"id": fid, "resolutionStatus": "resolved", "outcome": "pinned keepalive to 32"})
        assert verified["caseEvents"] == ["verification_passed"] and rejected["caseEvents"] == ["verification_failed"]
        assert closed["caseEvents"] == ["case_closed"] and "backprop" not in closed
        missing = await tool_error(s, "amend", {"id": "frag-0000000000000000", "topic": "x"})
        assert missing == {"success": False, "error": "Fragment not found"}
        for args in ({"topic": "x"}, {"id": fid, "type": "episode"}, {"id": fid, "content": "y" * 4001}, {"id": fid, "importance": 2}):
            assert (await rpc_error(s, "amend", args)).code == -32602
        secret = await rpc_error(s, "amend", {"id": fid, "content": "The admin password=Winter2024! works on staging."})
        assert secret.code == -32602 and "password_assignment" in secret.message and "Winter2024" not in secret.message
    async with db(stack.database_url) as conn:
        events = await conn.fetch("SELECT event_type, summary FROM case_events WHERE case_id = $1 ORDER BY id", case)
    assert [e["event_type"] for e in events] == ["verification_passed", "verification_failed", "case_closed"]
    assert events[2]["summary"] == "pinned keepalive to 32"
    assert abs((await fragment(stack.database_url, peer))["importance"] - 0.5) < 1e-6  # backprop is off here


async def test_amend_supersedes_replaces_the_fragment(stack, mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        fid = await _remember(s, content="Releases are cut from the develop branch every Friday.", importance=0.8)
        reply = await call(s, "amend", {"id": fid, "content": "Releases are cut from main every second Friday.", "supersedes": True})
    assert reply["superseded"] == fid and reply["id"] != fid
    old, new = await fragment(stack.database_url, fid), await fragment(stack.database_url, reply["id"])
    assert old["valid_to"] is not None and old["superseded_by"] == reply["id"] and abs(old["importance"] - 0.4) < 1e-6
    assert new["content"] == "Releases are cut from main every second Friday." and abs(new["importance"] - 0.8) < 1e-6


async def test_amend_supersedes_without_changing_the_content(stack, mcp_url: str, master_key: str) -> None:
    # The successor takes the row's embedding as read back (a pgvector Vector, not an array).
    async with mcp_session(mcp_url, master_key) as s:
        fid = await _remember(s, content="Staging deploys need a green canary for ten minutes.", importance=0.5)
        reply = await call(s, "amend", {"id": fid, "importance": 0.9, "supersedes": True})
    old, new = await fragment(stack.database_url, fid), await fragment(stack.database_url, reply["id"])
    assert old["superseded_by"] == reply["id"] and new["content"] == old["content"]
    assert new["embedding"] is not None and abs(new["importance"] - 0.9) < 1e-6


async def test_link_types_weight_cycles_and_dry_run(stack, mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        ws = unique()
        # Unlike contents: near-twins get auto-linked ('related', a -> b among them) by a link
        # job that may land before the first link call, which would then find it made.
        contents = (
            "The queue consumer stalled after the broker restart.",
            "Grafana dashboards moved to the shared folder in May.",
            "The billing team prefers invoices in euros.",
        )
        a, b, c = [await _remember(s, content=text, workspace=ws) for text in contents]
        default = await call(s, "link", {"fromId": a, "toId": b})
        assert default == {"success": True, "fromId": a, "toId": b, "relationType": "related", "weight": 1.0, "created": True}
        for relation in ("caused_by", "resolved_by", "part_of", "contradicts"):
            assert (await call(s, "link", {"fromId": a, "toId": c, "relationType": relation, "weight": 0.4}))["created"] is True
        reweighted = await call(s, "link", {"fromId": a, "toId": b, "weight": 0.25})
        assert reweighted["created"] is False
        await call(s, "link", {"fromId": b, "toId": c, "relationType": "caused_by"})
        # a caused_by c exists and b caused_by c; c caused_by a closes a -> c -> a.
        dry = await call(s, "link", {"fromId": c, "toId": a, "relationType": "caused_by", "dryRun": True})
        assert dry["dryRun"] is True and dry["cycle"] is True and dry["wouldCreate"] is False and dry["ownership"] == "ok"
        cycle = await tool_error(s, "link", {"fromId": c, "toId": a, "relationType": "caused_by"})
        assert cycle["success"] is False and "cycle" in cycle["error"] and cycle["cyclePath"][0] == a
        # Symmetric relations never cycle.
        assert (await call(s, "link", {"fromId": c, "toId": a, "relationType": "related"}))["success"] is True
        ok_dry = await call(s, "link", {"fromId": b, "toId": a, "relationType": "part_of", "dryRun": True})
        assert ok_dry["wouldCreate"] is True and ok_dry["cycle"] is False
        missing = await tool_error(s, "link", {"fromId": a, "toId": "frag-0000000000000000"})
        assert missing == {"success": False, "error": "Fragment not found"}
        for args in ({"fromId": a, "toId": a}, {"fromId": a, "toId": b, "relationType": "likes"}, {"fromId": a, "toId": b, "weight": 1.5}, {"fromId": a}):
            assert (await rpc_error(s, "link", args)).code == -32602
    async with db(stack.database_url) as conn:
        weight = await conn.fetchval("SELECT weight FROM fragment_links WHERE from_id = $1 AND to_id = $2 AND relation_type = 'related'", a, b)
        assert abs(weight - 0.25) < 1e-6
        assert await conn.fetchval("SELECT count(*) FROM fragment_links WHERE from_id = $1 AND to_id = $2 AND relation_type = 'part_of'", b, a) == 0


async def test_forget_three_replies_and_dry_run(stack, mcp_url: str, master_key: str) -> None:
    topic = unique("topic")
    async with mcp_session(mcp_url, master_key) as s:
        anchor = await _remember(s, content="The root CA certificate expires in March 2031.", topic=topic, isAnchor=True)
        plain = await _remember(s, content="The intermediate certificate is renewed by cert-manager.", topic=topic)
        await call(s, "link", {"fromId": plain, "toId": anchor})
        dry = await call(s, "forget", {"topic": topic, "dryRun": True})
        assert dry["dryRun"] is True and dry["wouldDelete"] == 1 and dry["protected"] == 1 and dry["linkCount"] == 2
        assert {t["id"]: t["protected"] for t in dry["targets"]} == {anchor: True, plain: False}
        protected = await call(s, "forget", {"id": anchor})
        assert protected == {"success": True, "deleted": 0, "protected": 1, "reason": "permanent 파편은 force 옵션 필요"}
        assert await call(s, "forget", {"topic": topic}) == {"success": True, "deleted": 1, "protected": 1}
        assert await call(s, "forget", {"id": anchor, "force": True}) == {"success": True, "deleted": 1}
        gone = await s.call_tool("forget", {"id": anchor})
        assert gone.is_error is True and gone.structured_content == {"success": True, "deleted": 0, "error": "Fragment not found or no permission"}
