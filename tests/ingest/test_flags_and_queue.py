"""Operator flags and the async queue's crash recovery, on a stack of their own: the policy
gate on, secrets redacted, feedback sampling at probability 1, case back-propagation on, a
short batch lease — and its own worker (and Redis), so the test can SIGKILL it mid-batch."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.maintenance.batch_worker import drain
from shared.repositories.batch_jobs import BatchQueue, new_job_id
from shared.settings import BatchWorkerSettings
from tests.ingest.helpers import (
    db, fragment, import_, ingest_call, principal_of, remember_while_key_locked, rpc_error, tool_error, wait_job,
)
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, unique

FLAGS = {
    "MEMENTO_SYMBOLIC_POLICY_RULES": "true",
    "ENGRAM_SECRET_POLICY": "redact",
    "MEMENTO_FEEDBACK_SAMPLING": "true",
    "MEMENTO_FEEDBACK_RATE_REMEMBER": "1",
    "MEMENTO_FEEDBACK_RATE_AMEND": "1",
    "MEMENTO_FEEDBACK_RATE_FORGET": "1",
    "MEMENTO_CASE_BACKPROP_ENABLED": "true",
    # seed: remember re-checks the quota under the key's row lock.
    "MEMENTO_REMEMBER_ATOMIC": "true",
    # A killed consumer's job is taken back after 3 s; beat looks every 2 s.
    "ENGRAM_BATCH_LEASE": "3",
    "ENGRAM_BATCH_RECOVER_INTERVAL": "2",
    "ENGRAM_BATCH_CHUNK": "20",
}


def _items(n: int, marker: str) -> list[dict]:
    return [{"content": f"Node {marker}-{i} of the search cluster serves shard {i}.", "topic": "search", "type": "fact"}
            for i in range(n)]


@pytest.fixture(scope="module")
def flagged(stack: Stack, stack_dir: Path) -> Iterator[Stack]:
    # restart=False: the kill test holds the worker down to show nobody consumes, then starts it.
    config = new_stack_config(stack_dir / "ingest-flags", database_url=stack.database_url, restart=False)
    config.extra_env = {**config.extra_env, **FLAGS}
    with Stack(config) as own:
        yield own


async def test_policy_rules_become_validation_warnings(flagged: Stack) -> None:
    ws = unique()
    base = {"workspace": ws, "resolutionStatus": "open"}
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        async def warnings(**args: Any) -> list[str]:
            reply = await call(s, "remember", {**base, **args})
            assert reply["success"] is True
            return reply.get("validation_warnings", [])

        assert await warnings(content="We chose Postgres for the event store.", topic="db", type="decision") == ["decisionHasRationale"]
        assert await warnings(content="We chose Postgres because it ships pgvector.", topic="db", type="decision") == []
        assert await warnings(content="The job queue stalls every night at 02:00.", topic="jobs", type="error", resolutionStatus=None) == [
            "errorHasResolutionPath", "caseIdHasResolutionStatus"]
        assert await warnings(content="Root cause: the cron overlap; fixed by a lock.", topic="jobs", type="error") == []
        assert await warnings(content="Restart the ingest service after config changes.", topic="ops", type="procedure") == ["procedureHasStepMarkers"]
        assert await warnings(content="1. Drain traffic 2. Restart the ingest service.", topic="ops", type="procedure") == []
        assert await warnings(content="The dark mode feature flag is enabled in production.", topic="flags", type="fact") == []
        assert await warnings(content="The dark mode feature flag is not enabled in production.", topic="flags", type="fact") == ["assertionNotContradictory"]
        assert await warnings(content="Nobody knows where this note belongs yet.", topic="misc", type="fact", workspace=None) == ["fragmentHasWorkspace"]
        dry = await call(s, "remember", {**base, "content": "We chose Redis for the cache layer.", "topic": "db", "type": "decision", "dryRun": True})
        assert dry["simulated"]["validation_warnings"] == ["decisionHasRationale"]


async def test_hard_gate_refuses_with_32003(flagged: Stack) -> None:
    raw, key_id = await create_api_key(flagged.database_url, symbolic_hard_gate=True, allowed_workspaces=["gated"])
    async with mcp_session(flagged.mcp_url, raw) as s:
        err = await rpc_error(s, "remember", {"content": "We chose Kafka for the audit stream.", "topic": "arch", "type": "decision",
                                              "workspace": "gated", "resolutionStatus": "open"})
        # fragmentHasWorkspace gates only with MEMENTO_WORKSPACE_GATE; workspaceNotAllowed never.
        unscoped = await call(s, "remember", {"content": "The office plants are watered every Monday.", "topic": "misc", "type": "fact", "resolutionStatus": "open"})
        outside = await call(s, "remember", {"content": "Quarterly reviews happen in the large meeting room.", "topic": "rooms", "type": "fact",
                                             "workspace": "elsewhere", "resolutionStatus": "open"})
    assert err.code == -32003 and err.message == "policy_violation: decisionHasRationale"
    assert err.data == {"violations": ["decisionHasRationale"], "fragmentType": "decision"}
    assert unscoped["success"] is True and unscoped["validation_warnings"] == ["fragmentHasWorkspace", "workspaceNotAllowed"]
    assert outside["success"] is True and outside["validation_warnings"] == ["workspaceNotAllowed"]
    async with db(flagged.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1", key_id) == 2


async def test_secrets_redacted_on_every_write_path(flagged: Stack) -> None:
    ws = unique()
    leaked = "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB"
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        one = await call(s, "remember", {"content": f"CI pushes with token {leaked} and password=hunter22.", "topic": "ci", "type": "fact", "workspace": ws})
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": "The deploy key is AKIAIOSFODNN7EXAMPLE in the vault.", "topic": "ci", "type": "fact"}]})
        amended = await call(s, "amend", {"id": one["id"], "content": f"CI now pushes with {leaked} only."})
        reflected = await call(s, "reflect", {"workspace": ws, "decisions": ["Rotate sk_live_4eC39HqLyjWDarjtT1zdp7dc every month."]})
        queued = await call(s, "batch_remember", {"workspace": ws, "async": True, "fragments": [
            {"content": "Webhook at https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx posts alerts.", "topic": "ci", "type": "fact"}]})
        assert (await wait_job(s, queued["jobId"]))["state"] == "completed"
    assert one["secrets_redacted"] == ["github_token", "password_assignment"]
    assert batch["results"][0]["secrets_redacted"] == ["aws_access_key"]
    assert amended["secrets_redacted"] == ["github_token"]
    async with db(flagged.database_url) as conn:
        contents = [r["content"] for r in await conn.fetch("SELECT content FROM fragments WHERE workspace = $1", ws)]
        versions = [r["content"] for r in await conn.fetch("SELECT content FROM fragment_versions WHERE fragment_id = $1", one["id"])]
    assert len(contents) == 4 and reflected["count"] == 1
    for text in contents + versions:
        for secret in (leaked, "hunter22", "AKIAIOSFODNN7EXAMPLE", "sk_live_4eC39", "hooks.slack.com/services/T0123"):
            assert secret not in text
    assert "[REDACTED:github_token]" in (await fragment(flagged.database_url, one["id"]))["content"]


async def test_admin_import_redacts_secrets_under_the_redact_policy(flagged: Stack) -> None:
    ws = unique()
    items = [{"content": "The mirror pushes with ghp_1234567890abcdefghijklmnopqrstuvwxyzAB every hour.",
              "topic": "ci", "type": "fact", "workspace": ws}]
    body = (await import_(flagged, flagged.master_key, items)).json()
    assert body["imported"] == 1 and body["results"][0]["secrets_redacted"] == ["github_token"]
    async with db(flagged.database_url) as conn:
        content = await conn.fetchval("SELECT content FROM fragments WHERE id = $1", body["results"][0]["id"])
    assert content == "The mirror pushes with [REDACTED:github_token] every hour."


async def test_feedback_hints_sampled_with_cooldown(flagged: Stack) -> None:
    ws = unique()
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        dry = await call(s, "remember", {"content": "A dry run is never sampled for feedback.", "topic": "fb", "type": "fact", "workspace": ws, "dryRun": True})
        first = await call(s, "remember", {"content": "The first write of this session gets a hint.", "topic": "fb", "type": "fact", "workspace": ws})
        second = await call(s, "remember", {"content": "The second write is inside the 900 s cooldown.", "topic": "fb", "type": "fact", "workspace": ws})
    assert "_meta" not in dry and "_meta" not in second
    hint = first["_meta"]["hints"]
    assert hint == [{
        "signal": "feedback_sampled",
        "suggestion": "방금 remember 결과가 의도한 대로 유용했는지 tool_feedback으로 평가해 주세요. relevant=false인 경우 irrelevance_reason도 함께 보내면 원인별 개선에 반영됩니다.",
        "trigger": "tool_feedback",
        "args": {"tool_name": "remember", "trigger_type": "sampled"},
    }]
    assert set(first["_meta"]) == {"hints", "serverTime"} and first["_meta"]["serverTime"]["timezone"] == "Asia/Seoul"
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        unchanged = await call(s, "amend", {"id": first["id"], "topic": "fb"})
        amended = await call(s, "amend", {"id": first["id"], "topic": "feedback"})
    assert "_meta" not in unchanged and amended["_meta"]["hints"][0]["args"]["tool_name"] == "amend"
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        gone = await call(s, "forget", {"id": second["id"]})
    assert gone["_meta"]["hints"][0]["args"] == {"tool_name": "forget", "trigger_type": "sampled"}


async def test_feedback_cap_of_two_per_session(flagged: Stack) -> None:
    from services.ingest.feedback import attach_hint
    from services.ingest.service import WriteResources
    from shared.settings import IngestSettings

    settings = IngestSettings(MEMENTO_FEEDBACK_SAMPLING=True, MEMENTO_FEEDBACK_RATE_REMEMBER=1, MEMENTO_FEEDBACK_COOLDOWN=0)
    redis = Redis.from_url(flagged.redis_url)
    try:
        res = WriteResources(pool=None, embedder=None, settings=settings, redis=redis)  # type: ignore[arg-type]
        session = unique("cap")
        hinted = [("_meta" in await attach_hint(res, "remember", session, {"success": True})) for _ in range(4)]
        other = await attach_hint(res, "remember", unique("cap"), {"success": True})
    finally:
        await redis.aclose()
    assert hinted == [True, True, False, False] and "_meta" in other


async def test_case_backprop_adjusts_the_case(flagged: Stack) -> None:
    case = unique("case")
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        ws = unique()
        main = (await call(s, "remember", {"content": "Checkout fails for carts over 100 items.", "topic": "shop", "type": "error",
                                            "caseId": case, "resolutionStatus": "open", "workspace": ws}))["id"]
        peer = (await call(s, "remember", {"content": "Cart size limit lives in the pricing service config.", "topic": "shop", "type": "fact",
                                            "caseId": case, "importance": 0.5, "resolutionStatus": "open", "workspace": ws}))["id"]
        reply = await call(s, "amend", {"id": main, "resolutionStatus": "resolved", "outcome": "raised the limit"})
    assert reply["backprop"] == {"caseId": case, "adjusted": 1} and reply["caseEvents"] == ["case_closed"]
    assert abs((await fragment(flagged.database_url, peer))["importance"] - 0.6) < 1e-6


async def test_quota_in_batch_and_concurrent_writers_cannot_exceed(flagged: Stack) -> None:
    """MEMENTO_REMEMBER_ATOMIC=true: two writers at once — an MCP client and a direct caller of ingest (as the batch worker
    is) — both past the key's limit: exactly the limit is stored."""
    raw, key_id = await create_api_key(flagged.database_url, fragment_limit=7)
    principal = await principal_of(flagged.database_url, raw)
    marker = unique("quota")
    async with mcp_session(flagged.mcp_url, raw) as s:
        singles = [call(s, "remember", {"content": f"Quota probe {marker} number {i} for the race.", "topic": "q", "type": "fact"})
                   for i in range(5)]
        direct = [ingest_call(flagged, principal, "remember", {"content": f"Direct probe {marker} number {i} for the race.", "topic": "q", "type": "fact"})
                  for i in range(5)]
        batches = [call(s, "batch_remember", {"fragments": _items(4, f"{marker}-a")}),
                   ingest_call(flagged, principal, "batch_remember", {"fragments": _items(4, f"{marker}-b")})]
        replies = await asyncio.gather(*singles, *direct, *batches)
        over = await tool_error(s, "remember", {"content": f"One more {marker} beyond the limit.", "topic": "q", "type": "fact"})
    replies = [r["result"] if "result" in r else r for r in replies]
    stored = sum(1 for r in replies[:10] if r.get("success")) + sum(r["inserted"] for r in replies[10:])
    assert stored == 7
    assert over["error"] == "fragment_limit_exceeded" and over["quota"]["limit"] == 7
    refused = {r["error"] for r in replies[:10] if not r.get("success")}
    refused |= {item["error"] for r in replies[10:] for item in r["results"] if not item["success"]}
    assert refused == {"fragment_limit_exceeded"}
    async with db(flagged.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE key_id = $1", key_id) == 7


async def test_atomic_remember_rechecks_quota_under_the_key_lock(flagged: Stack) -> None:
    """MEMENTO_REMEMBER_ATOMIC=true: remember waits for the key's row lock before its quota
    re-check and insert (seed _rememberAtomic), and stores once the lock is released."""
    raw, key_id = await create_api_key(flagged.database_url, fragment_limit=5)
    waited, reply = await remember_while_key_locked(flagged, raw, key_id, f"Atomic quota probe {unique()} behind the key lock.")
    assert waited is True
    assert reply["success"] is True and reply["quota"] == {"used": 1, "limit": 5, "remaining": 4}


async def test_dead_letter_after_retries(flagged: Stack) -> None:
    """A job whose every attempt fails (ingest unreachable) is retried, then dead-lettered."""
    prefix = unique("engram:batch-test")
    redis = Redis.from_url(flagged.redis_url)
    settings = BatchWorkerSettings(REDIS_URL=flagged.redis_url, ENGRAM_BATCH_INGEST_URL="http://127.0.0.1:9", ENGRAM_BATCH_LEASE=0.2)
    try:
        queue = BatchQueue(redis, prefix=prefix)
        job_id = new_job_id()
        principal = await principal_of(flagged.database_url, (await create_api_key(flagged.database_url))[0])
        await queue.enqueue(job_id, {"items": [{"index": 0, "item": {"content": "x", "topic": "t", "type": "fact"}}], "principal": principal},
                            accepted=1, rejected=0, key_id=principal["key_id"])
        states = []
        for _ in range(12):
            await drain(settings, prefix)
            status = await queue.status(job_id)
            states.append(status["state"])
            if status["state"] == "dead":
                break
            await asyncio.sleep(0.3)
        assert states[-1] == "dead" and int(status["attempts"]) == 4 and "ingest unreachable" in status["error"]
        assert [j.decode() for j in await redis.lrange(queue.dead, 0, -1)] == [job_id]
        assert await redis.llen(queue.processing) == 0 and await redis.llen(queue.queue) == 0
    finally:
        await redis.aclose()


async def test_worker_killed_mid_batch_loses_nothing_and_doubles_nothing(flagged: Stack) -> None:
    ws = unique("kill")
    marker = unique("m")
    jobs = []
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        for j in range(3):
            items = [{"content": f"Kill test {marker} job {j} item {i}: sensor {i} reports {i * 7} degrees.", "topic": "sensors", "type": "fact"}
                     for i in range(200)]
            reply = await call(s, "batch_remember", {"fragments": items, "workspace": ws, "async": True})
            assert reply["accepted"] == 200
            jobs.append(reply["jobId"])
        # Kill once the first chunk of the first job is committed and before everything is.
        for _ in range(600):
            status = await call(s, "batch_status", {"jobId": jobs[0]})
            if status["processed"] > 0:
                break
            await asyncio.sleep(0.05)
        worker = flagged.processes["worker"]
        worker.signal(signal.SIGKILL)
        await asyncio.to_thread(worker.process.wait, 30)
        at_kill = [await call(s, "batch_status", {"jobId": j}) for j in jobs]
        assert any(st["state"] != "completed" for st in at_kill), at_kill
        await asyncio.sleep(1)
        frozen = [await call(s, "batch_status", {"jobId": j}) for j in jobs]
        assert [st["processed"] for st in frozen] == [st["processed"] for st in at_kill]  # nobody is consuming
        worker.start()
        finals = [await wait_job(s, j, timeout=300) for j in jobs]
    assert [(f["state"], f["accepted"], f["processed"], f["failed"]) for f in finals] == [("completed", 200, 200, 0)] * 3
    async with db(flagged.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE workspace = $1", ws) == 600
        assert await conn.fetchval("SELECT count(DISTINCT content) FROM fragments WHERE workspace = $1", ws) == 600
        keys = await conn.fetchval("SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE ANY($1::text[])", [f"{j}#%" for j in jobs])
        assert keys == 600
