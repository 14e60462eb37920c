"""Relevance search (q, not query), the enabled set, the injection context (recordReference,
maxTokens and its snake_case alias) and stats (agent-experience banks kept apart)."""

from __future__ import annotations

import asyncpg

from tests.memory_api.conftest import API, Tenant


async def test_search_ranks_across_namespaces_and_checks_q(tenant: Tenant) -> None:
    tooling = (await tenant.namespace("tooling"))["id"]
    food = (await tenant.namespace("food"))["id"]
    pnpm = await tenant.entry(tooling, "Prefer pnpm over npm in this repository.")
    await tenant.entry(tooling, "Commit messages are written in the imperative mood.")
    await tenant.entry(food, "The user is allergic to peanuts and avoids satay.")
    found = (await tenant.client.get(f"{API}/entries", params={"q": "package manager", "limit": 5})).json()
    assert found[0]["id"] == pnpm["id"] and len(found) <= 5
    only_food = (await tenant.client.get(f"{API}/entries", params={"q": "package manager", "namespace": food})).json()
    assert all(e["namespaceId"] == food for e in only_food)
    nuts = (await tenant.client.get(f"{API}/entries", params={"q": "nut allergy", "namespace": food})).json()
    assert nuts[0]["content"].startswith("The user is allergic")
    assert len((await tenant.client.get(f"{API}/entries", params={"q": "repository", "limit": 1})).json()) == 1

    assert (await tenant.client.get(f"{API}/entries", params={"query": "package manager"})).status_code == 400
    assert (await tenant.client.get(f"{API}/entries", params={"q": ""})).status_code == 400
    assert (await tenant.client.get(f"{API}/entries", params={"q": "é" * 251})).status_code == 400  # 502 bytes
    assert (await tenant.client.get(f"{API}/entries", params={"q": "a" * 500})).status_code == 200


async def test_enabled_set_and_context(tenant: Tenant, db: asyncpg.Connection) -> None:
    on = (await tenant.namespace("Coding style"))["id"]
    off = (await tenant.namespace("Old notes"))["id"]
    kept = await tenant.entry(on, "Prefer pnpm over npm in this repository.")
    hidden = await tenant.entry(off, "We used to deploy on Fridays.")
    await tenant.client.patch(f"{API}/namespaces/{off}/toggle", json={"enabled": False})

    enabled = (await tenant.client.get(f"{API}/entries/enabled", params={"tag": "ignored"})).json()
    assert [e["id"] for e in enabled] == [kept["id"]]

    async def accesses(entry_id: str) -> int:
        return int(await db.fetchval("SELECT access_count FROM fragments WHERE id = $1", entry_id))

    view = await tenant.client.get(f"{API}/context", params={"maxTokens": 2000, "recordReference": "false"})
    assert view.status_code == 200
    body = view.json()
    assert body["entryCount"] == 1 and body["namespaceCount"] == 1 and body["tokenCount"] > 0
    assert "Prefer pnpm" in body["content"] and "Coding style" in body["content"] and "Fridays" not in body["content"]
    assert await accesses(kept["id"]) == 0  # display only: no reference recorded
    assert (await tenant.client.get(f"{API}/context")).status_code == 200  # default: records
    assert await accesses(kept["id"]) == 1
    await tenant.client.get(f"{API}/context", params={"record_reference": "false", "max_tokens": 500})
    assert await accesses(kept["id"]) == 1
    assert await accesses(hidden["id"]) == 0

    assert (await tenant.client.get(f"{API}/context", params={"maxTokens": 0})).status_code == 400
    assert (await tenant.client.get(f"{API}/context", params={"max_tokens": 0})).status_code == 400
    assert (await tenant.client.get(f"{API}/context", params={"maxTokens": -1})).status_code == 400
    assert (await tenant.client.get(f"{API}/context", params={"maxTokens": 10_000_000})).status_code == 200
    tiny = (await tenant.client.get(f"{API}/context", params={"maxTokens": 3, "recordReference": "false"})).json()
    assert tiny["entryCount"] == 0 and tiny["content"] == ""


async def test_stats_keep_agent_experience_apart(tenant: Tenant) -> None:
    plain = (await tenant.namespace("plain"))["id"]
    experience = (await tenant.namespace("Agent Experience: reviewer", "[agent-experience] reviewer"))["id"]
    await tenant.entry(plain, "Manual fact about the build.")
    await tenant.entry(plain, "Automatic fact about the build.", "auto")
    await tenant.entry(experience, "The reviewer agent learned to check migrations first.", "auto")
    stats = (await tenant.client.get(f"{API}/stats")).json()
    assert stats["totalEntries"] == 2 and stats["bySource"] == {"auto": 1, "manual": 1}
    assert stats["totalNamespaces"] == 1 and stats["enabledNamespaces"] == 1
    assert stats["byKind"] == {"fact": 2}
    assert sum(day["count"] for day in stats["createdPerDay"]) == 2
    assert all(e["namespaceId"] != experience for e in stats["recentlyUpdated"])
    rows = {row["namespaceId"]: row for row in stats["perNamespace"]}
    assert rows[experience]["isAgentExperience"] is True and rows[experience]["entryCount"] == 1
    assert rows[plain]["isAgentExperience"] is False and rows[plain]["entryCount"] == 2
    assert stats["agentExperience"]["namespaceCount"] == 1 and stats["agentExperience"]["entries"] == 1
