"""A keyword recall for a word stored once puts that fragment first, even when the caller's
scope is full of near-identical fragments: here another tenant's 2,500 imported global
fragments, which the master key's workspace scope holds (fusion.SEMANTIC_SD_FLOOR)."""

from __future__ import annotations

import json

import httpx

from tests.support import Stack, call, create_api_key, mcp_session, unique

API = "/api/v1/memory"


async def test_a_unique_keyword_ranks_its_one_match_first_among_bulk_fragments(stack: Stack) -> None:
    bulk_key, _ = await create_api_key(stack.database_url)
    entries = [{"id": f"b-{i}", "namespaceId": "b", "content": f"Bank fact {i}: the service sharding key is tenant-{i % 97}",
                "source": "manual", "tags": [], "metadata": {}, "createdAt": "2025-01-01T00:00:00Z",
                "updatedAt": "2025-01-01T00:00:00Z"} for i in range(2500)]
    document = {"version": 1, "exportedAt": "2026-01-01T00:00:00Z", "namespaces": [
        {"namespace": {"id": "b", "name": unique("bulk"), "description": "bulk", "enabled": True,
                       "createdAt": "2025-01-01T00:00:00Z", "updatedAt": "2025-01-01T00:00:00Z"}, "entries": entries}]}
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers={"X-API-Key": bulk_key}, timeout=600) as http:
        reply = await http.post(f"{API}/import", json={"data": json.dumps(document)})
    assert reply.status_code == 200, reply.text

    owner, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("okapi")
    async with mcp_session(stack.mcp_url, owner) as s:
        stored = await call(s, "remember", {"content": f"The {marker} service stores invoices in S3 buckets.",
                                            "topic": "billing", "type": "fact", "workspace": ws})
    async with mcp_session(stack.mcp_url, stack.master_key) as s:
        found = await call(s, "recall", {"keywords": [marker], "workspace": ws})
    assert found["fragments"][0]["id"] == stored["id"], found["searchPath"]
