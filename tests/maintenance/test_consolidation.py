"""The consolidation cycle through the real worker: each stage's rule, the safety gate,
tenant isolation and idempotent reruns."""

from __future__ import annotations

import numpy as np
import pytest

from shared.domain.passages import embedding_text
from tests.maintenance.factories import add_fragment, fragment, links, new_key, run_task


async def test_exact_and_semantic_dedup_behind_the_safety_gate(mstack, db, embedder, producer) -> None:
    _, key = await new_key(mstack.database_url)
    add = lambda text, **kw: add_fragment(db, embedder, text, key_id=key, **kw)  # noqa: E731
    exact_a = await add("The nightly export job writes CSV files to the reports bucket.", age_days=2)
    exact_b = await add("The nightly export job writes CSV files to the reports bucket.", age_days=1)
    para_a = await add("Grafana alerts page the on-call engineer via PagerDuty.", importance=0.7)
    para_b = await add("Grafana alerts page the on-call engineer through PagerDuty.", importance=0.5)
    v16 = await add("The staging Postgres cluster runs version 16 with 32 GB of memory.", age_days=1)
    v15 = await add("The staging Postgres cluster runs version 15 with 32 GB of memory.")
    on = await add("Feature flags are enabled in staging for the checkout flow.", age_days=1)
    off = await add("Feature flags are disabled in staging for the checkout flow.")

    run = await run_task(db, producer, tenant=f"key:{key}", stages=["exact_dedup", "semantic_dedup", "contradictions"])
    assert run["status"] == "succeeded", run
    stages = run["result"]["stages"]

    # Exact duplicate: the younger copy is superseded by the older one, with a link.
    assert (await fragment(db, exact_b))["superseded_by"] == exact_a
    assert (await fragment(db, exact_a))["valid_to"] is None
    assert any(link["to_id"] == exact_a for link in await links(db, [exact_b], "superseded_by"))
    # Paraphrase: merged into the more important one, which keeps the higher importance.
    assert (await fragment(db, para_b))["superseded_by"] == para_a
    assert stages["semantic_dedup"]["processed"] >= 1
    # Safety gate: "16" vs "15" embeds at ~0.98 but the merge would lose a fact.
    assert (await fragment(db, v16))["valid_to"] is None and (await fragment(db, v15))["valid_to"] is None
    assert stages["semantic_dedup"]["blockedBySafetyGate"] >= 1
    blocked = {tuple(sorted(b["ids"])): b for b in stages["semantic_dedup"]["blocked"]}
    assert "16" in blocked[tuple(sorted([v16, v15]))]["missing"] or "15" in blocked[tuple(sorted([v16, v15]))]["missing"]
    # Near-identical but opposite: kept apart, and linked as a contradiction (newer -> older).
    assert (await fragment(db, on))["valid_to"] is None and (await fragment(db, off))["valid_to"] is None
    contradicts = {(r["from_id"], r["to_id"]) for r in await links(db, [on, off, v16, v15], "contradicts")}
    assert (off, on) in contradicts and (v15, v16) in contradicts
    assert all(r["key_id"] == key for r in await links(db, [on, v15], "contradicts"))

    # Idempotent: a rerun has nothing left to merge or link.
    again = await run_task(db, producer, tenant=f"key:{key}", stages=["exact_dedup", "semantic_dedup", "contradictions"])
    assert again["status"] == "succeeded"
    assert again["result"]["stages"]["exact_dedup"]["processed"] == 0
    assert again["result"]["stages"]["semantic_dedup"]["processed"] == 0
    assert again["result"]["stages"]["contradictions"]["processed"] == 0


async def test_never_across_tenants(mstack, db, embedder, producer) -> None:
    _, key_a = await new_key(mstack.database_url)
    _, key_b = await new_key(mstack.database_url)
    same = "The payments service retries a declined card three times before giving up."
    near_a = "Grafana dashboards for checkout live in the shared ops folder."
    near_b = "Grafana dashboards for checkout live in the shared ops folder!"
    a1 = await add_fragment(db, embedder, same, key_id=key_a, topic="payments")
    b1 = await add_fragment(db, embedder, same, key_id=key_b, topic="payments")
    a2 = await add_fragment(db, embedder, near_a, key_id=key_a, topic="payments")
    b2 = await add_fragment(db, embedder, near_b, key_id=key_b, topic="payments")
    a3 = await add_fragment(db, embedder, "Feature flags are enabled for the payments canary.", key_id=key_a, topic="payments")
    b3 = await add_fragment(db, embedder, "Feature flags are disabled for the payments canary.", key_id=key_b, topic="payments")
    m1 = await add_fragment(db, embedder, same, key_id=None, topic="payments")
    # A master search that returned both keys' fragments together, twice.
    for _ in range(3):
        await db.execute(
            "INSERT INTO search_events (key_id, query_type, result_ids, result_count) VALUES (NULL, 'text', $1, 3)",
            [a1, b1, m1],
        )

    # Every tenant at once: the run that could leak, if any could.
    run = await run_task(db, producer, tenant="all")
    assert run["status"] == "succeeded", run
    ids = [a1, b1, a2, b2, a3, b3, m1]
    for fid in ids:
        assert (await fragment(db, fid))["valid_to"] is None, f"{fid} was merged across tenants"
    for link in await links(db, ids):
        ends = {(await fragment(db, link["from_id"]))["key_id"], (await fragment(db, link["to_id"]))["key_id"]}
        assert len(ends) == 1, f"cross-tenant link {dict(link)}"


async def test_decay_by_half_life_once_and_anchors_exempt(mstack, db, embedder, producer) -> None:
    _, key = await new_key(mstack.database_url)
    # fact half-life 90 days: 90 days old -> halved; error half-life 60 days -> quartered after 120.
    fact = await add_fragment(db, embedder, "The cache TTL for product pages is five minutes.", key_id=key, age_days=90, importance=0.8)
    error = await add_fragment(db, embedder, "Checkout failed with a 502 during the sale.", key_id=key, type="error", age_days=120, importance=0.8)
    anchor = await add_fragment(db, embedder, "Never deploy on Fridays.", key_id=key, age_days=400, importance=0.9, is_anchor=True)
    fresh = await add_fragment(db, embedder, "The office moved to the fourth floor.", key_id=key, importance=0.6)

    run = await run_task(db, producer, tenant=f"key:{key}", stages=["importance_decay"])
    assert run["status"] == "succeeded", run
    assert (await fragment(db, fact))["importance"] == pytest.approx(0.4, abs=0.005)
    assert (await fragment(db, error))["importance"] == pytest.approx(0.2, abs=0.005)
    assert (await fragment(db, anchor))["importance"] == pytest.approx(0.9)
    assert (await fragment(db, fresh))["importance"] == pytest.approx(0.6)

    again = await run_task(db, producer, tenant=f"key:{key}", stages=["importance_decay"])
    assert again["result"]["stages"]["importance_decay"]["processed"] == 0
    assert (await fragment(db, fact))["importance"] == pytest.approx(0.4, abs=0.005)


async def test_tiers_then_gc_with_grace_and_utility(mstack, db, embedder, producer) -> None:
    _, key = await new_key(mstack.database_url)
    stale = await add_fragment(db, embedder, "A one-off note about an old lunch order.", key_id=key, age_days=200, importance=0.1)
    recent_cold = await add_fragment(db, embedder, "A low-value note from last month.", key_id=key, age_days=40, importance=0.1)
    used = await add_fragment(db, embedder, "The API gateway timeout is 30 seconds.", key_id=key, access_count=8, accessed_days_ago=1)
    anchor = await add_fragment(db, embedder, "Production database is eu-west-1.", key_id=key, age_days=300, importance=0.1, is_anchor=True)

    run = await run_task(db, producer, tenant=f"key:{key}", stages=["ttl_tiers", "expiry_gc"])
    assert run["status"] == "succeeded", run
    assert (await fragment(db, used))["ttl_tier"] == "hot"
    assert (await fragment(db, anchor))["ttl_tier"] == "permanent"
    assert (await fragment(db, recent_cold))["ttl_tier"] == "cold"  # cold, but inside the grace period
    assert await fragment(db, stale) is None
    assert stale in run["result"]["stages"]["expiry_gc"]["deleted"]


async def test_backfill_activation_co_retrieval_and_sessions(mstack, db, embedder, producer) -> None:
    _, key = await new_key(mstack.database_url)
    bare = await add_fragment(db, embedder, "The search indexer reindexes every night at 02:00.", key_id=key, embed=False)
    long = await add_fragment(db, embedder, "Indexer: It reindexes at 02:00. It reads the replica. It takes ten minutes.",
                              key_id=key, embed=False)
    hot = await add_fragment(db, embedder, "Runbook: restart the indexer with make reindex.", key_id=key, age_days=20,
                             accessed_days_ago=14, ema_activation=0.8)
    x = await add_fragment(db, embedder, "The indexer reads from the orders replica.", key_id=key, topic="search")
    y = await add_fragment(db, embedder, "Index mappings live in infra/search/mappings.", key_id=key, topic="search")
    for _ in range(2):
        await db.execute(
            "INSERT INTO search_events (key_id, query_type, result_ids, result_count) VALUES ($1, 'text', $2, 2)", key, [x, y]
        )
    await db.execute(
        "INSERT INTO sessions (id, key_id, last_activity_at) VALUES ($1, $2, now() - interval '3 days')", f"idle-{bare}", key
    )

    run = await run_task(db, producer, tenant=f"key:{key}",
                         stages=["embedding_backfill", "activation_decay", "co_retrieval", "session_cleanup"])
    assert run["status"] == "succeeded", run
    backfilled = (await fragment(db, bare))["embedding"]
    assert backfilled is not None
    # the text a write embeds (its topic, then its content), not the content alone
    written = embedder.embed([embedding_text("ops", "The search indexer reindexes every night at 02:00.")])[0]
    assert float(np.dot(np.asarray(backfilled.to_list()), written)) > 0.999
    # with its passages (shared.domain.passages): three sentences, two passages
    assert await db.fetchval("SELECT count(*) FROM fragment_passages WHERE fragment_id = $1", long) == 2
    assert await db.fetchval("SELECT count(*) FROM fragment_passages WHERE fragment_id = $1", bare) == 0
    assert (await fragment(db, hot))["ema_activation"] == pytest.approx(0.2, abs=0.01)  # two half-lives of 7 days
    co = await links(db, [x, y], "co_retrieved")
    assert len(co) == 1 and co[0]["key_id"] == key
    session = await db.fetchrow("SELECT ended_at, end_reason FROM sessions WHERE id = $1", f"idle-{bare}")
    assert session["ended_at"] is not None and session["end_reason"] == "expired"


async def test_passage_backfill_of_fragments_stored_before_passages(mstack, db, embedder, producer) -> None:
    """Migration 0012 queues fragments stored before passages existed (an embedding, no
    passage rows); the passage_backfill stage embeds their passages, leaves a fragment's own
    passages alone, and stays inside the run's tenant."""
    from shared.domain.passages import passages
    from shared.schema.migrate import migration_files

    _, key = await new_key(mstack.database_url)
    _, other_key = await new_key(mstack.database_url)
    three = "Indexer: It reindexes at 02:00. It reads the replica. It takes ten minutes."
    old = await add_fragment(db, embedder, three, key_id=key)
    two = await add_fragment(db, embedder, "The indexer runs nightly. It is fast.", key_id=key)  # its own only passage
    kept = await add_fragment(db, embedder, "Cache: It warms at boot. It holds 2 GB. It evicts least recently used.",
                              key_id=key)
    sentinel = np.zeros(384, dtype=np.float32)
    sentinel[0] = 1.0
    await db.execute("INSERT INTO fragment_passages (fragment_id, ordinal, embedding) VALUES ($1, 0, $2)", kept, sentinel)
    single = await add_fragment(db, embedder, "The indexer has no dashboard", key_id=key)
    elsewhere = await add_fragment(db, embedder, three, key_id=other_key)

    # The upgrade: the migration's statements, as a store that predates passages runs them.
    migration = dict(migration_files())["0012_passage_backfill.sql"]
    await db.execute(migration)
    queued = {r["fragment_id"] for r in await db.fetch("SELECT fragment_id FROM passage_backfill")}
    assert {old, two, elsewhere} <= queued  # two sentence breaks or more are pre-selected
    assert kept not in queued and single not in queued  # has passages / one sentence
    await db.execute("INSERT INTO passage_backfill VALUES ($1) ON CONFLICT DO NOTHING", kept)

    run = await run_task(db, producer, tenant=f"key:{key}", stages=["passage_backfill"])
    assert run["status"] == "succeeded", run
    assert run["result"]["stages"]["passage_backfill"]["processed"] == 1
    assert run["result"]["stages"]["passage_backfill"]["checked"] == 3

    rows = await db.fetch("SELECT ordinal, embedding FROM fragment_passages WHERE fragment_id = $1 ORDER BY ordinal", old)
    expected = embedder.embed(passages(three))
    assert [r["ordinal"] for r in rows] == list(range(len(expected))) == [0, 1]
    for row, vector in zip(rows, expected, strict=True):
        assert float(np.dot(np.asarray(row["embedding"].to_list()), vector)) > 0.99
    assert await db.fetchval("SELECT count(*) FROM fragment_passages WHERE fragment_id = $1", two) == 0
    kept_rows = await db.fetch("SELECT embedding FROM fragment_passages WHERE fragment_id = $1", kept)
    assert len(kept_rows) == 1 and kept_rows[0]["embedding"].to_list()[0] == 1.0
    remaining = {r["fragment_id"] for r in await db.fetch("SELECT fragment_id FROM passage_backfill")}
    assert not remaining & {old, two, kept}
    # another tenant's fragment is not this run's work
    assert elsewhere in remaining
    assert await db.fetchval("SELECT count(*) FROM fragment_passages WHERE fragment_id = $1", elsewhere) == 0

    again = await run_task(db, producer, tenant=f"key:{key}", stages=["passage_backfill"])
    assert again["result"]["stages"]["passage_backfill"]["processed"] == 0


async def test_supersession_of_a_changed_decision(mstack, db, embedder, producer) -> None:
    _, key = await new_key(mstack.database_url)
    old = await add_fragment(db, embedder, "We decided the billing cron runs at 01:00 UTC.", key_id=key, type="decision",
                             topic="billing", age_days=10, importance=0.8)
    new = await add_fragment(db, embedder, "We decided the billing cron runs at 04:00 UTC.", key_id=key, type="decision",
                             topic="billing", importance=0.8)
    run = await run_task(db, producer, tenant=f"key:{key}", stages=["semantic_dedup", "contradictions", "supersession"])
    assert run["status"] == "succeeded", run
    row = await fragment(db, old)
    assert row["superseded_by"] == new and row["valid_to"] is not None
    assert row["importance"] == pytest.approx(0.4, abs=0.01)
    assert (await fragment(db, new))["valid_to"] is None


async def test_llm_judges_the_ambiguous_band_only_when_configured(mstack, db, embedder, producer, fake_llm) -> None:
    _, key = await new_key(mstack.database_url)
    tabs = await add_fragment(db, embedder, "The team prefers tabs for indentation in Go code.", key_id=key, type="preference", age_days=1)
    spaces = await add_fragment(db, embedder, "The team prefers spaces for indentation in Go code.", key_id=key, type="preference")
    before = len(fake_llm.requests)
    run = await run_task(db, producer, tenant=f"key:{key}", stages=["contradictions"])
    assert run["status"] == "succeeded", run
    assert run["result"]["stages"]["contradictions"]["signals"].get("llm") == 1
    assert (spaces, tabs) in {(r["from_id"], r["to_id"]) for r in await links(db, [tabs], "contradicts")}
    assert len(fake_llm.requests) > before
    assert fake_llm.requests[-1]["auth"] == "Bearer fake-key" and fake_llm.requests[-1]["path"] == "/v1/chat/completions"
    assert run["result"]["llmCalls"] >= 1


async def test_working_memory_goes_with_its_reflected_session(mstack, db, embedder, producer) -> None:
    """seed: scope=session fragments vanish when the session ends (here: once reflected)."""
    _, key = await new_key(mstack.database_url)
    ended, live = f"wm-ended-{key}#1", f"wm-live-{key}#1"
    await db.execute(
        """INSERT INTO sessions (id, transport_id, key_id, started_at, last_activity_at, ended_at, reflected_at)
           VALUES ($1, $2, $3, now(), now(), now(), now()), ($4, $5, $3, now(), now(), NULL, NULL)""",
        ended, ended.split("#")[0], key, live, live.split("#")[0],
    )
    scratch = await add_fragment(db, embedder, "Scratch note: try the blue deployment first.", key_id=key,
                                 session_id=ended, scope="session")
    kept = await add_fragment(db, embedder, "The blue deployment is the canary.", key_id=key, session_id=ended)
    current = await add_fragment(db, embedder, "Scratch note: the green one is still warming up.", key_id=key,
                                 session_id=live, scope="session")
    run = await run_task(db, producer, tenant=f"key:{key}", stages=["session_cleanup"])
    assert run["status"] == "succeeded", run
    assert run["result"]["stages"]["session_cleanup"]["workingMemoryDropped"] == 1
    assert await fragment(db, scratch) is None
    assert await fragment(db, kept) is not None and await fragment(db, current) is not None


async def test_a_capped_dedup_run_leaves_the_rest_for_the_next_cycle(mstack, db, embedder, monkeypatch) -> None:
    """Bounded work per run must not mean forgotten work: when semantic dedup stops at its
    limit, the group's mark stays put and the next cycle merges what was left."""
    import dataclasses

    from services.maintenance import pipeline
    from shared.db import create_pool
    from shared.llm import LLMClient, LLMSettings
    from shared.repositories.maintenance import Tenant
    from shared.settings import MaintenanceSettings

    _, key = await new_key(mstack.database_url)
    for i in range(3):
        text = f"The nightly export number {i} writes its archive to the cold storage bucket."
        await add_fragment(db, embedder, text + ".", key_id=key, topic=f"export-{i}", age_days=1)
        # Older than the marks' lag, so only an unadvanced mark lets a later cycle see it again.
        await add_fragment(db, embedder, text + "!", key_id=key, topic=f"export-{i}", age_days=0.5)
    # The same stage, limited to one merge per cycle.
    monkeypatch.setattr(pipeline, "STAGES", [
        dataclasses.replace(s, limit=1) if s.name == "semantic_dedup" else s for s in pipeline.STAGES
    ])
    pool = await create_pool(mstack.database_url, min_size=1, max_size=2)
    llm = LLMClient(LLMSettings(LLM_BASE_URL=None, LLM_MODEL=None))
    try:
        merged = []
        for _ in range(3):
            ctx = pipeline.CycleContext(pool=pool, tenant=Tenant.parse(f"key:{key}"), settings=MaintenanceSettings(),
                                        llm=llm, budget=llm.budget(), embedder=lambda: embedder)
            report = await pipeline.run_cycle(ctx, only=["semantic_dedup"])
            merged.append(report["stages"]["semantic_dedup"]["processed"])
    finally:
        await pool.close()
    assert merged == [1, 1, 1]
    live = await db.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1 AND valid_to IS NULL", key)
    assert live == 3
