"""Consolidation and extraction (reference 001): the lexical pass (auto entries only, the
threshold's range, agent-experience banks refused), 503 without a model (extract's 400s
first), and with an OpenAI-compatible fake LLM at its HTTP boundary: the LLM pass, its
status, extraction, ensure-model-available."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from tests.memory_api.conftest import API, FakeLLM, Tenant, client
from tests.support import create_api_key


async def test_lexical_pass_merges_and_prunes_auto_entries_only(tenant: Tenant, db: asyncpg.Connection) -> None:
    ns = (await tenant.namespace())["id"]
    a = await tenant.entry(ns, "The staging database runs Postgres on port 5433", "auto", tags=["db"], metadata={"from": "a"})
    b = await tenant.entry(ns, "The staging database runs Postgres on port 5433 today", "auto", tags=["staging"])
    manual = await tenant.entry(ns, "The staging database runs Postgres on port 5433", "manual")
    old = await tenant.entry(ns, "A stale automatic note about the old CI server", "auto")
    other = await tenant.entry(ns, "Release notes are written by the on-call engineer", "auto")
    await db.execute("UPDATE fragments SET updated_at = now() - $2::interval WHERE id = $1", old["id"], timedelta(days=90))

    url = f"{API}/namespaces/{ns}/consolidate"
    assert (await tenant.client.post(url, json={"config": {"similarityThreshold": 1.5}})).status_code == 400
    assert (await tenant.client.post(url, json={"config": {"similarityThreshold": -0.1}})).status_code == 400
    reply = await tenant.client.post(url, json={"config": {"similarityThreshold": 0.7}})
    assert reply.status_code == 200
    assert reply.json() == {"mergedCount": 1, "removedCount": 1, "unchangedCount": 1, "prunedCount": 1}
    left = {e["id"]: e for e in (await tenant.client.get(f"{API}/namespaces/{ns}/entries")).json()}
    assert manual["id"] in left and other["id"] in left and old["id"] not in left
    survivors = [i for i in (a["id"], b["id"]) if i in left]
    assert survivors == [b["id"]]  # the newest of the cluster stays, with every member's tags and metadata
    assert set(left[b["id"]]["tags"]) == {"db", "staging"} and left[b["id"]]["metadata"] == {"from": "a"}
    # Nothing left to do: a second pass changes nothing; an empty body takes the defaults.
    again = await tenant.client.post(url)
    assert again.json()["mergedCount"] == 0 and again.json()["prunedCount"] == 0
    assert (await tenant.client.post(f"{API}/namespaces/{ns}/consolidate", json={"config": {"maxEntryAgeDays": 0}})).json()[
        "prunedCount"] == 2  # every auto entry is older than 0 days; the manual one stays
    assert manual["id"] in {e["id"] for e in (await tenant.client.get(f"{API}/namespaces/{ns}/entries")).json()}


async def test_agent_experience_banks_are_not_consolidated(tenant: Tenant) -> None:
    marked = (await tenant.namespace(description="[agent-experience] reviewer"))["id"]
    named = (await tenant.namespace("Agent Experience: planner"))["id"]
    for ns in (marked, named):
        await tenant.entry(ns, "Learned: check migrations first", "auto")
        await tenant.entry(ns, "Learned: check migrations first!", "auto")
        reply = await tenant.client.post(f"{API}/namespaces/{ns}/consolidate")
        assert reply.status_code == 400
        assert len((await tenant.client.get(f"{API}/namespaces/{ns}/entries")).json()) == 2


async def test_model_passes_answer_503_without_a_model(tenant: Tenant) -> None:
    post = tenant.client.post
    # extract checks the transcript first: 400 even though no model runs.
    assert (await post(f"{API}/extract", json={"messages": []})).status_code == 400
    assert (await post(f"{API}/extract", json={"messages": [{"role": "user", "content": "hi"}] * 101})).status_code == 400
    assert (await post(f"{API}/extract", json={"messages": [{"role": "user", "content": "a" * 50_001}]})).status_code == 400
    assert (await post(f"{API}/extract", json={})).status_code == 422
    reply = await post(f"{API}/extract", json={"messages": [{"role": "user", "content": "I prefer pnpm."}]})
    assert reply.status_code == 503
    assert (await post(f"{API}/consolidation/run")).status_code == 503
    status = (await tenant.client.get(f"{API}/consolidation/status")).json()
    assert status["enabled"] is False and status["due"] is True and status["lastRunAt"] is None
    assert status["lastAttemptAt"] and "LLM" in status["lastError"]  # the refused run was an attempt
    assert (await post(f"{API}/ensure-model-available")).json() == "disabled"


async def test_llm_pass_status_extraction_and_model_check(stack, llm_gateway: str, fake_llm: FakeLLM) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with client(llm_gateway, key) as http:
        tenant = Tenant(key, None, http)
        ns = (await tenant.namespace("Infra"))["id"]
        first = await tenant.entry(ns, "The staging database is Postgres 18.", "auto", tags=["db"])
        second = await tenant.entry(ns, "Staging's database is Postgres version 18.", "auto", tags=["pg"], metadata={"src": "chat"})
        manual = await tenant.entry(ns, "The staging database is Postgres 18.", "manual")
        experience = (await tenant.namespace("Agent Experience: ops", "[agent-experience] ops"))["id"]
        await tenant.entry(experience, "The staging database is Postgres 18.", "auto")
        await tenant.entry(experience, "Staging's database is Postgres version 18.", "auto")

        before = len(fake_llm.requests)
        report = (await http.post(f"{API}/consolidation/run")).json()
        assert report["clustersConsolidated"] == 1 and report["entriesRemoved"] == 2 and report["entriesCreated"] == 1
        assert report["namespacesSkipped"] == 1 and report["llmCalls"] >= 1
        call = fake_llm.requests[before]
        assert call["path"] == "/v1/chat/completions" and call["auth"] == "Bearer fake-key"
        assert "Postgres 18" in call["body"]["messages"][1]["content"]
        left = (await http.get(f"{API}/namespaces/{ns}/entries")).json()
        ids = {e["id"] for e in left}
        assert manual["id"] in ids and first["id"] not in ids and second["id"] not in ids
        [rewritten] = [e for e in left if e["content"] == fake_llm.merged]
        assert rewritten["source"] == "auto" and set(rewritten["tags"]) == {"db", "pg"} and rewritten["metadata"] == {"src": "chat"}
        assert len((await http.get(f"{API}/namespaces/{experience}/entries")).json()) == 2
        status = (await http.get(f"{API}/consolidation/status")).json()
        assert status["enabled"] is True and status["due"] is False and status["lastRunAt"] and "lastError" not in status

        extracted = await http.post(f"{API}/extract", json={"messages": [
            {"role": "user", "content": "Use pnpm, never npm. We deploy to Kubernetes."}, {"role": "assistant", "content": "Noted."}]})
        assert extracted.status_code == 200 and extracted.json() == {"created": 2, "updated": 0, "skipped": 0}
        assert "user: Use pnpm" in fake_llm.requests[-1]["body"]["messages"][1]["content"]
        again = (await http.post(f"{API}/extract", json={"messages": [{"role": "user", "content": "Same again."}]})).json()
        assert again == {"created": 0, "updated": 0, "skipped": 2, "emptyReason": {"reason": "allDeduped", "candidateCount": 2}}
        fake_llm.facts = "NONE"
        try:
            nothing = (await http.post(f"{API}/extract", json={"messages": [{"role": "user", "content": "hello"}]})).json()
        finally:
            fake_llm.facts = FakeLLM.facts
        assert nothing["emptyReason"] == {"reason": "nothingWorthSaving"} and nothing["created"] == 0
        assert (await http.post(f"{API}/ensure-model-available", json={"model": "fake-model"})).json() == "alreadyLoaded"
        assert (await http.post(f"{API}/ensure-model-available", json={"model": "other"})).json() == "modelNotFound"


async def test_lexical_pass_reads_only_the_500_most_recently_updated_auto_entries(tenant: Tenant) -> None:
    import json
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    name = f"window-{now.timestamp():.0f}"
    entries = [{"content": "The nightly backup runs at two in the morning", "source": "auto",
                "createdAt": (now - timedelta(days=1, seconds=i)).isoformat(),
                "updatedAt": (now - timedelta(days=1, seconds=i)).isoformat()} for i in range(505)]
    document = {"version": 1, "namespaces": [{"namespace": {"name": name, "description": ""}, "entries": entries}]}
    reply = await tenant.client.post(f"{API}/import", json={"data": json.dumps(document)})
    assert reply.json()["entriesImported"] == 505
    ns = [n for n in (await tenant.client.get(f"{API}/namespaces")).json() if n["name"] == name][0]["id"]
    result = (await tenant.client.post(f"{API}/namespaces/{ns}/consolidate")).json()
    # The 500 newest are one cluster: one stays, 499 go; the 5 oldest were never read.
    assert result == {"mergedCount": 1, "removedCount": 499, "unchangedCount": 0, "prunedCount": 0}
    left = (await tenant.client.get(f"{API}/namespaces/{ns}/entries")).json()
    assert len(left) == 6
    def instant(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    kept = sorted(instant(e["updatedAt"]) for e in left)
    oldest_five = sorted(instant(e["updatedAt"]) for e in entries[500:])
    assert kept[:5] == oldest_five  # untouched: outside the window
    assert kept[5] > instant(entries[0]["updatedAt"])  # the cluster's survivor (its updatedAt moved to now)
