"""The worker as a service: memory_consolidate over MCP, trace context and correlation id
from task headers, Prometheus metrics per task, AutoReflect on session end and by beat."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import httpx
import pytest

from shared.jobs import QUEUE_MAINTENANCE
from tests.maintenance.conftest import wait_for
from tests.maintenance.factories import add_fragment, new_key, run_task
from tests.support import call, mcp_session, unique


async def test_memory_consolidate_reports_each_stage(mstack, db, embedder) -> None:
    admin_raw, admin_id = await new_key(mstack.database_url, permissions=["read", "write", "admin"])
    await add_fragment(db, embedder, "The build cache lives in the artifacts bucket.", key_id=admin_id)
    await add_fragment(db, embedder, "The build cache lives in the artifacts bucket.", key_id=admin_id)
    async with mcp_session(mstack.mcp_url, admin_raw) as s:
        report = await call(s, "memory_consolidate", {})
    assert report["success"] is True and report["status"] == "succeeded", report
    # An admin key maintains its own tenant; the master key every tenant.
    assert report["tenant"] == f"key:{admin_id}"
    assert set(report["stages"]) >= {"ttl_tiers", "importance_decay", "expiry_gc", "exact_dedup", "semantic_dedup",
                                     "contradictions", "supersession", "embedding_backfill", "co_retrieval",
                                     "session_cleanup", "anomalies", "activation_decay"}
    assert report["stages"]["exact_dedup"]["processed"] == 1
    assert all("durationMs" in stage and "limit" in stage for stage in report["stages"].values())

    async with mcp_session(mstack.mcp_url, mstack.master_key) as s:
        queued = await call(s, "memory_consolidate", {"wait": False, "stages": ["anomalies"]})
    assert queued["queued"] is True
    row = await wait_for(lambda: db.fetchrow(
        "SELECT * FROM maintenance_runs WHERE id = $1 AND status = 'succeeded'", queued["runId"]))
    assert row["tenant"] == "all"

    writer_raw, _ = await new_key(mstack.database_url, permissions=["read", "write"])
    async with mcp_session(mstack.mcp_url, writer_raw) as s:
        with pytest.raises(Exception):  # seed: -32600 without the admin permission
            await call(s, "memory_consolidate", {})


async def test_trace_context_and_correlation_id_ride_the_task_headers(mstack, db, producer) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "x-correlation-id": "cid-maint-test"}
    run = await run_task(db, producer, tenant="master", stages=["anomalies"], headers=headers)
    assert run["status"] == "succeeded"
    assert run["result"]["traceId"] == trace_id
    assert run["result"]["correlationId"] == "cid-maint-test"


async def test_worker_serves_prometheus_metrics_per_task(mstack, db, producer, metrics_port) -> None:
    await run_task(db, producer, tenant="master", stages=["ttl_tiers"])

    async def scrape() -> str | None:
        async with httpx.AsyncClient() as http:
            try:
                text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            except httpx.HTTPError:
                return None
        return text if 'engram_task_runs_total{state="SUCCESS",task="maintenance.consolidate"}' in text else None

    text = await wait_for(scrape, timeout=30)
    assert text, "worker metrics missing the consolidate task"
    assert 'engram_task_duration_seconds_count{task="maintenance.consolidate"}' in text
    assert 'engram_consolidation_stage_seconds_count{stage="ttl_tiers"}' in text


async def _session_with_work(db: asyncpg.Connection, embedder, key_id: str, ws: str) -> str:
    sid = f"{unique('transport')}#1"
    await db.execute(
        """INSERT INTO sessions (id, transport_id, key_id, workspace, started_at, last_activity_at, ended_at, end_reason, activity)
           VALUES ($1, $2, $3, $4, now() - interval '40 minutes', now() - interval '1 minute', now(), 'closed', $5::jsonb)""",
        sid, sid.split("#")[0], key_id, ws, json.dumps([{"tool": "remember", "at": "x"}, {"tool": "recall", "at": "y"}]),
    )
    for content, ftype, extra in (
        ("We decided to retry webhook deliveries with exponential backoff up to 6 times.", "decision", {}),
        ("Deploy failed because the migration locked the orders table.", "error",
         {"resolution_status": "resolved", "outcome": "ran the migration CONCURRENTLY"}),
        ("To rotate the webhook secret: create the new one, dual-sign for an hour, drop the old.", "procedure", {}),
    ):
        await add_fragment(db, embedder, content, key_id=key_id, type=ftype, topic="webhooks", workspace=ws,
                           session_id=sid, **extra)
    return sid


async def test_auto_reflect_on_session_end(mstack, db, embedder, producer, fake_llm) -> None:
    _, key = await new_key(mstack.database_url)
    ws = unique("ws")
    sid = await _session_with_work(db, embedder, key, ws)
    await asyncio.to_thread(producer.send_task, "maintenance.auto_reflect",
                            kwargs={"session_id": sid, "key_id": key, "reason": "closed"}, queue=QUEUE_MAINTENANCE)
    reflected = await wait_for(lambda: db.fetchval("SELECT reflected_at FROM sessions WHERE id = $1", sid))
    error = await db.fetchval("SELECT reflect_error FROM sessions WHERE id = $1", sid)
    assert reflected, f"session not reflected: {error}"
    rows = await db.fetch("SELECT type, content, key_id, workspace FROM fragments WHERE session_id = $1 AND topic = 'session_reflect'", sid)
    assert rows and all(r["key_id"] == key and r["workspace"] == ws for r in rows)
    # No summary fact any more: it was a count of what the session stored, which no later
    # agent can use (issue 17). The resolved error's cause -> fix and the LLM's narrative remain.
    assert {"error", "episode"} <= {r["type"] for r in rows}
    assert "fact" not in {r["type"] for r in rows}
    # The session's own decision and procedure are handed over verbatim, and ingest maps them
    # onto the fragments that already say so (content hash) instead of storing them twice.
    run = await db.fetchrow("SELECT result FROM maintenance_runs WHERE job = 'auto_reflect' AND params->>'sessionId' = $1"
                            " AND status = 'succeeded'", sid)
    breakdown = json.loads(run["result"])["breakdown"]
    assert breakdown["decisions"] == 1 and breakdown["procedures"] == 1 and breakdown["errors"] == 1
    episode = next(r["content"] for r in rows if r["type"] == "episode")
    assert episode == fake_llm.narrative  # the LLM is configured here: it wrote the narrative
    assert any("Fix: ran the migration CONCURRENTLY" in r["content"] for r in rows if r["type"] == "error")

    # Redelivery is harmless: already reflected, nothing new stored.
    await asyncio.to_thread(producer.send_task, "maintenance.auto_reflect",
                            kwargs={"session_id": sid, "key_id": key, "reason": "closed"}, queue=QUEUE_MAINTENANCE)
    await asyncio.sleep(3)
    again = await db.fetchval("SELECT count(*) FROM fragments WHERE session_id = $1 AND topic = 'session_reflect'", sid)
    assert again == len(rows)


async def test_beat_sweep_reflects_sessions_whose_job_was_lost(mstack, db, embedder) -> None:
    _, key = await new_key(mstack.database_url)
    sid = await _session_with_work(db, embedder, key, unique("ws"))
    # No task sent: beat's reflect sweep (every 3 s here) finds the ended, unreflected row.
    reflected = await wait_for(lambda: db.fetchval("SELECT reflected_at FROM sessions WHERE id = $1", sid), timeout=60)
    assert reflected, await db.fetchval("SELECT reflect_error FROM sessions WHERE id = $1", sid)


async def test_closing_an_mcp_session_reflects_it(mstack, db) -> None:
    raw, key = await new_key(mstack.database_url)
    ws = unique("ws")
    async with mcp_session(mstack.mcp_url, raw) as s:
        await call(s, "remember", {"content": "We decided to pin the Node version to 22 in CI.", "topic": "ci",
                                   "type": "decision", "workspace": ws})
    session = await wait_for(lambda: db.fetchrow(
        "SELECT id, reflected_at FROM sessions WHERE key_id = $1 AND reflected_at IS NOT NULL", key), timeout=60)
    assert session, "the gateway's session end did not lead to a reflection"
    stored = await db.fetch("SELECT type FROM fragments WHERE session_id = $1 AND topic = 'session_reflect'", session["id"])
    assert "episode" in {r["type"] for r in stored}


async def test_a_run_survives_its_worker_process_being_killed(mstack, db, embedder, producer) -> None:
    """acks_late + reject_on_worker_lost: SIGKILL the pool process mid-run, the task is
    redelivered, the new process takes over the same run row and finishes it, once."""
    import os
    import signal

    import psutil

    from shared.jobs import QUEUE_MAINTENANCE as queue

    _, key = await new_key(mstack.database_url)
    ids = [await add_fragment(db, embedder, f"Backfill item {i}: the {i}th service listens on port {8000 + i}.",
                              key_id=key, embed=False) for i in range(400)]
    run_id = await db.fetchval(
        "INSERT INTO maintenance_runs (job, tenant, status) VALUES ('consolidate', $1, 'queued') RETURNING id", f"key:{key}"
    )
    await asyncio.to_thread(producer.send_task, "maintenance.consolidate",
                            kwargs={"run_id": run_id, "tenant": f"key:{key}", "stages": ["embedding_backfill"]}, queue=queue)
    assert await wait_for(lambda: db.fetchval("SELECT status = 'running' FROM maintenance_runs WHERE id = $1", run_id), timeout=60)
    worker = psutil.Process(mstack.processes["worker"].process.pid)
    children = worker.children(recursive=True)
    assert children, "no pool process to kill"
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    done = await wait_for(lambda: db.fetchval(
        "SELECT status FROM maintenance_runs WHERE id = $1 AND status NOT IN ('queued', 'running')", run_id), timeout=180)
    assert done == "succeeded"
    missing = await db.fetchval("SELECT count(*) FROM fragments WHERE id = ANY($1::text[]) AND embedding IS NULL", ids)
    assert missing == 0


async def test_consolidation_invalidates_recall_cache(mstack, db, producer) -> None:
    """A cycle rewrites and deletes fragments; afterwards no cached recall may be served."""
    import redis.asyncio as aioredis

    from shared.recall_cache import EPOCH

    client = aioredis.Redis.from_url(mstack.redis_url)
    try:
        before = int(await client.get(EPOCH) or 0)
        run = await run_task(db, producer, tenant="master", stages=["anomalies"])
        assert run["status"] == "succeeded"

        async def bumped() -> bool:
            return int(await client.get(EPOCH) or 0) > before

        assert await wait_for(bumped, timeout=15)
    finally:
        await client.aclose()


async def test_link_sweep_links_fragments_whose_job_never_came(mstack, db, embedder, producer) -> None:
    """Fragments written without a post-commit link job (straight into the table, as an
    import or a lost message leaves them) are pending from their insert; the sweep links
    them within their tenant and takes them off the pending list. One without an embedding
    stays pending until it has one."""
    _, key_id = await new_key(mstack.database_url)
    _, other_id = await new_key(mstack.database_url)
    text = "The nightly backup of the orders database runs at 02:00 UTC."
    first = await add_fragment(db, embedder, text, key_id=key_id)
    second = await add_fragment(db, embedder, "Nightly backups of the orders database run at 2 am UTC.", key_id=key_id)
    foreign = await add_fragment(db, embedder, text, key_id=other_id)
    bare = await add_fragment(db, embedder, "No vector for this one yet.", key_id=key_id, embed=False)
    ids = [first, second, foreign, bare]
    pending = {r["fragment_id"] for r in await db.fetch(
        "SELECT fragment_id FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", ids)}
    assert pending <= set(ids) and bare in pending  # (beat's own sweep may have taken some already)

    await asyncio.to_thread(producer.send_task, "maintenance.link_sweep", queue=QUEUE_MAINTENANCE)

    async def swept() -> bool:
        left = await db.fetch("SELECT fragment_id FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", ids)
        return {r["fragment_id"] for r in left} == {bare}

    assert await wait_for(swept)
    related = {(r["from_id"], r["to_id"]) for r in await db.fetch(
        "SELECT from_id, to_id FROM fragment_links WHERE relation_type = 'related' AND from_id = ANY($1::text[])", ids)}
    assert (first, second) in related and (second, first) in related
    assert not any(foreign in pair for pair in related)  # the other tenant's twin is never linked
