"""Admin export (JSON Lines) and import (JSON array) through the gateway, master key only;
import goes through ingest's write path (validation, secret screening, embeddings)."""

from __future__ import annotations

from typing import Any

import httpx

from services.ingest.service import RETRY_CONFLICTS
from tests.ingest.helpers import ADMIN_PREFIX as PREFIX
from tests.ingest.helpers import admin_auth as _auth
from tests.ingest.helpers import db, export, import_
from tests.support import call, create_api_key, mcp_session, unique


def _without(record: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in names}


async def test_export_is_tenant_scoped_and_round_trips_through_import(stack, mcp_url: str) -> None:
    raw_a, key_a = await create_api_key(stack.database_url)
    raw_b, key_b = await create_api_key(stack.database_url)
    topic, other_topic = unique("export"), unique("export")
    marker = unique("walrus")
    async with mcp_session(mcp_url, raw_a) as s:
        first = await call(s, "remember", {"content": f"The {marker} cluster stores invoices in eu-west-1.", "topic": topic,
                                           "type": "fact", "keywords": ["invoices"], "workspace": "billing"})
        second = await call(s, "remember", {"content": f"We chose {marker} partitioning because invoices grow monthly.",
                                            "topic": topic, "type": "decision", "isAnchor": True, "caseId": "case-7"})
        third = await call(s, "remember", {"content": f"Kafka lag on the {marker} consumer pages the on-call.",
                                           "topic": other_topic, "type": "error", "resolutionStatus": "open"})
    async with mcp_session(mcp_url, raw_b) as s:
        theirs = await call(s, "remember", {"content": f"Tenant B keeps its own {marker} notes apart.", "topic": topic, "type": "fact"})

    # A closed session may add its auto-reflect episode (topic session_reflect) any time.
    mine = [r for r in await export(stack, stack.master_key, key_id=key_a) if r["topic"] != "session_reflect"]
    assert [r["id"] for r in mine] == [first["id"], second["id"], third["id"]]
    assert {r["key_id"] for r in mine} == {key_a}
    assert theirs["id"] not in {r["id"] for r in mine}
    assert mine[0]["content"] == f"The {marker} cluster stores invoices in eu-west-1." and mine[0]["workspace"] == "billing"
    assert mine[1]["is_anchor"] is True and mine[1]["ttl_tier"] == "permanent" and mine[1]["case_id"] == "case-7"
    assert "embedding" not in mine[0]
    only_topic = await export(stack, stack.master_key, key_id=key_a, topic=topic)
    assert [r["id"] for r in only_topic] == [first["id"], second["id"]]
    everyone = {r["id"] for r in await export(stack, stack.master_key, topic=topic)}
    assert {first["id"], second["id"], theirs["id"]} <= everyone

    # Gone from the store, then restored from the export: same ids, same history. The worker's
    # link job may still hold some of these rows: the delete is retried as ingest's would be.
    async with db(stack.database_url) as conn:
        async for attempt in RETRY_CONFLICTS.copy():
            with attempt:
                await conn.execute("DELETE FROM fragments WHERE key_id = $1", key_a)
    restored = await import_(stack, stack.master_key, mine)
    assert restored.status_code == 200, restored.text
    body = restored.json()
    assert (body["total"], body["imported"], body["existing"], body["failed"]) == (3, 3, 0, 0)
    assert [r["id"] for r in body["results"]] == [first["id"], second["id"], third["id"]]
    again = [r for r in await export(stack, stack.master_key, key_id=key_a) if r["topic"] != "session_reflect"]
    assert [_without(r, "updated_at") for r in again] == [_without(r, "updated_at") for r in mine]
    async with db(stack.database_url) as conn:
        embedded = await conn.fetchval("SELECT count(*) FROM fragments WHERE id = ANY($1::text[]) AND embedding IS NOT NULL",
                                       [r["id"] for r in mine])
    assert embedded == 3

    # Searchable by its tenant at once (read-your-writes), invisible to the other tenant.
    async with mcp_session(mcp_url, raw_a) as s:
        found = await call(s, "recall", {"keywords": [marker], "pageSize": 10})
    assert first["id"] in [f["id"] for f in found["fragments"]]
    async with mcp_session(mcp_url, raw_b) as s:
        found = await call(s, "recall", {"keywords": [marker], "pageSize": 10})
    assert first["id"] not in [f["id"] for f in found["fragments"]]

    # Re-importing is idempotent: every id answers existing, nothing doubles.
    repeat = (await import_(stack, stack.master_key, {"fragments": mine})).json()
    assert (repeat["imported"], repeat["existing"], repeat["failed"]) == (0, 3, 0)
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1 AND topic <> 'session_reflect'", key_a) == 3


async def test_export_and_import_need_the_master_key(stack) -> None:
    raw, key_id = await create_api_key(stack.database_url, permissions=["read", "write", "admin"])
    async with httpx.AsyncClient(timeout=30) as http:
        for method, path in (("GET", "/export"), ("POST", "/import")):
            anonymous = await http.request(method, f"{stack.gateway_url}{PREFIX}{path}", content=b"[]")
            tenant = await http.request(method, f"{stack.gateway_url}{PREFIX}{path}", content=b"[]", headers=_auth(raw))
            assert (anonymous.status_code, tenant.status_code) == (401, 403), path
        unknown = await http.get(f"{stack.gateway_url}{PREFIX}/export", params={"key_id": "no-such-key"}, headers=_auth(stack.master_key))
    assert unknown.status_code == 404


async def test_import_validates_and_refuses_secrets_per_item(stack, mcp_url: str) -> None:
    ws = unique()
    token = "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB"
    items = [
        {"content": "The importer keeps the nightly report schedule at 02:00 UTC.", "topic": "reports", "type": "fact", "workspace": ws},
        {"content": f"The mirror pushes with {token} every hour.", "topic": "ci", "type": "fact", "workspace": ws},
        {"content": "tiny", "topic": "reports", "type": "fact", "workspace": ws},
        {"content": "A fragment of a type the reference does not know.", "topic": "reports", "type": "memo", "workspace": ws},
        "not an object",
        {"content": "The keywords field can also carry a secret.", "topic": "ci", "type": "fact", "workspace": ws,
         "keywords": ["password=hunter22"]},
        {"id": "frag-import-created", "content": "A history row keeps its timestamps on import.", "topic": "reports",
         "type": "fact", "workspace": ws, "created_at": "not a time"},
    ]
    response = await import_(stack, stack.master_key, items)
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert (body["imported"], body["failed"]) == (1, 6)
    assert results[0]["success"] is True and results[0]["id"].startswith("frag-")
    assert results[1] == {"index": 1, "success": False, "error": results[1]["error"]}
    assert "content contains a secret (github_token)" in results[1]["error"]
    assert results[2]["error"] == "Content too short: length < 10 and word count < 3"
    assert results[3]["error"].startswith("type:")
    assert results[4]["error"] == "content is required"
    assert "keywords contains a secret (password_assignment)" in results[5]["error"]
    assert results[6]["error"] == "created_at: expected an ISO 8601 timestamp"
    async with db(stack.database_url) as conn:
        stored = [r["content"] for r in await conn.fetch("SELECT content FROM fragments WHERE workspace = $1", ws)]
        leaked = await conn.fetchval("SELECT count(*) FROM fragments WHERE content LIKE '%ghp_%' OR 'password=hunter22' = ANY(keywords)")
    assert stored == ["The importer keeps the nightly report schedule at 02:00 UTC."]
    assert leaked == 0

    # Items without ids are de-duplicated by content: on a second import, and within one.
    repeat = (await import_(stack, stack.master_key, items[:1])).json()
    assert repeat["results"] == [{"index": 0, "success": True, "id": results[0]["id"], "duplicate": True}]
    twice = {"content": f"The same note {unique()} sent twice in one import.", "topic": "reports", "type": "fact", "workspace": ws}
    doubled = (await import_(stack, stack.master_key, [twice, twice])).json()["results"]
    assert doubled[1] == {"index": 1, "success": True, "id": doubled[0]["id"], "duplicate": True}

    bad = [await import_(stack, stack.master_key, body) for body in ({"fragments": []}, {"x": 1}, 42)]
    assert [r.status_code for r in bad] == [400, 400, 400]
    async with httpx.AsyncClient(timeout=30) as http:
        broken = await http.post(f"{stack.gateway_url}{PREFIX}/import", content=b"[{", headers=_auth(stack.master_key))
    assert broken.status_code == 400 and "not valid JSON" in broken.text


async def test_import_into_a_tenant_and_ids_of_other_tenants(stack, mcp_url: str) -> None:
    raw_a, key_a = await create_api_key(stack.database_url)
    raw_b, key_b = await create_api_key(stack.database_url)
    marker = unique("otter")
    async with mcp_session(mcp_url, raw_a) as s:
        held = await call(s, "remember", {"content": f"Tenant A's {marker} retention is ninety days.", "topic": "retention", "type": "fact"})
    items = [
        {"content": f"Imported {marker} note for tenant B about the staging cluster.", "topic": "staging", "type": "fact"},
        {"id": held["id"], "content": f"An attempt to overwrite A's {marker} fragment.", "topic": "retention", "type": "fact"},
        {"content": f"A second {marker} note that names a key_id of its own.", "topic": "staging", "type": "fact", "key_id": key_a},
    ]
    body = (await import_(stack, stack.master_key, items, key_id=key_b)).json()
    assert [r["success"] for r in body["results"]] == [True, False, True]
    assert body["results"][1]["error"] == f"id {held['id']} belongs to another tenant's fragment"
    async with db(stack.database_url) as conn:
        owners = {r["id"]: r["key_id"] for r in await conn.fetch(
            "SELECT id, key_id FROM fragments WHERE id = ANY($1::text[])", [r.get("id") for r in body["results"]] + [held["id"]])}
        content = await conn.fetchval("SELECT content FROM fragments WHERE id = $1", held["id"])
    assert owners == {body["results"][0]["id"]: key_b, body["results"][2]["id"]: key_b, held["id"]: key_a}
    assert content == f"Tenant A's {marker} retention is ninety days."
    exported = [r for r in await export(stack, stack.master_key, key_id=key_b) if r["topic"] != "session_reflect"]
    assert sorted(r["id"] for r in exported) == sorted([body["results"][0]["id"], body["results"][2]["id"]])
    async with mcp_session(mcp_url, raw_b) as s:
        found = await call(s, "recall", {"keywords": [marker], "pageSize": 10})
    assert body["results"][0]["id"] in [f["id"] for f in found["fragments"]]
    unknown = (await import_(stack, stack.master_key, [{**items[0], "key_id": "no-such-key"}])).json()
    assert unknown["results"][0] == {"index": 0, "success": False, "error": "unknown key_id no-such-key"}
