"""Redis trouble on the write path, on a stack of its own (its own Postgres too: the job
outbox of a shared database would be drained by the session stack's healthy relay).

The stack reaches Redis through a switch in this process (services/stack/redis_switch.py):
a TCP proxy that forwards to a real redis-server, or, hung, accepts connections and answers
nothing (what makes connect and read timeouts bite, unlike a refused port). While it hangs every write must still be
reported as stored, be stored once, and keep its background jobs; when Redis answers again
the jobs reach the worker. Timings are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.stack.redis_server import LocalRedis
from services.stack.redis_switch import RedisSwitch
from services.stack.supervisor import free_port
from shared.domain.principal import Principal
from shared.jobs import QUEUE_MAINTENANCE, broker_key, celery_client
from shared.repositories import maintenance as runs_repo
from shared.repositories import outbox as outbox_repo
from shared.repositories.maintenance import Tenant
from tests.ingest.helpers import db, ingest_call
from tests.support import Stack, new_stack_config, running, unique

MASTER = Principal.master().to_wire()


@pytest.fixture(scope="module")
def redis_switch(stack_dir: Path) -> Iterator[RedisSwitch]:
    redis = LocalRedis(stack_dir / "switched-redis", free_port())
    redis.start()
    switch = RedisSwitch(redis.port)
    switch.start()
    yield switch
    switch.stop()
    redis.stop()


@pytest.fixture(scope="module")
async def switched(stack: Stack, stack_dir: Path, redis_switch: RedisSwitch) -> AsyncIterator[Stack]:
    # beat off: the ingest relay alone must bring the jobs to the worker.
    config = new_stack_config(stack_dir / "redis-faults", redis_url=redis_switch.url, beat=False)
    async with running(config) as own:
        yield own


async def _write(stack: Stack, tool: str, arguments: dict[str, Any], timings: list[float]) -> dict[str, Any]:
    started = time.monotonic()
    reply = await ingest_call(stack, MASTER, tool, arguments)
    timings.append(time.monotonic() - started)
    assert "result" in reply, reply
    return reply


async def _read(stack: Stack, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call on recall's internal API, as the gateway makes it."""
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{stack.recall_urls[0]}/v1/tools/{tool}",
            json={"arguments": arguments, "principal": MASTER, "session": None},
            headers={"x-engram-service-token": stack.service_token},
        )
    return response.json()


async def _until(predicate: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.25)


async def test_writes_while_redis_hangs_are_stored_once_and_their_jobs_run_after(
    switched: Stack, redis_switch: RedisSwitch
) -> None:
    ws = unique()
    timings: list[float] = []
    # Redis up: a first write warms every client's connection.
    await _write(switched, "remember", {"content": "The staging cluster runs three etcd members.", "topic": "infra",
                                        "type": "fact", "workspace": ws}, timings)
    up = timings.pop()

    redis_switch.set("hung")
    contents = [f"Rack {i} of the hung-Redis drill hosts {i + 2} storage nodes." for i in range(6)]
    remembered: list[str] = []
    for i, content in enumerate(contents):
        reply = await _write(switched, "remember", {"content": content, "topic": "racks", "type": "fact", "workspace": ws,
                                                   "idempotencyKey": f"{ws}-{i}"}, timings)
        assert reply["isError"] is False and reply["result"]["success"] is True, reply
        remembered.append(reply["result"]["id"])
    batch = [{"content": f"Switch {i} of the drill uplinks at {i + 1}0 Gbit/s.", "topic": "net", "type": "fact"} for i in range(3)]
    sync = await _write(switched, "batch_remember", {"fragments": batch[:2], "workspace": ws}, timings)
    queued = await _write(switched, "batch_remember", {"fragments": batch[2:], "workspace": ws, "async": True}, timings)
    assert sync["isError"] is False and sync["result"]["inserted"] == 2, sync
    # The async queue lives in Redis: it is stored synchronously instead, and says so.
    assert queued["isError"] is False and queued["result"]["inserted"] == 1, queued
    amended = await _write(switched, "amend", {"id": remembered[0], "content": "Rack 0 of the hung-Redis drill hosts 9 storage nodes.",
                                               "supersedes": True}, timings)
    assert amended["isError"] is False and amended["result"]["success"] is True, amended
    linked = await _write(switched, "link", {"fromId": remembered[1], "toId": remembered[2], "relationType": "related"}, timings)
    assert linked["isError"] is False and linked["result"]["success"] is True, linked
    forgot = await _write(switched, "forget", {"id": remembered[5]}, timings)
    assert forgot["isError"] is False and forgot["result"]["deleted"] == 1, forgot
    reflected = await _write(switched, "reflect", {"summary": ["The hung-Redis drill stored every write."],
                                                   "workspace": ws}, timings)
    assert reflected["isError"] is False and reflected["result"]["count"] >= 1, reflected
    # The consolidation is the worker's: recorded now, it waits for the broker.
    consolidation = await _write(switched, "memory_consolidate", {"wait": True}, timings)
    assert consolidation["isError"] is False and consolidation["result"]["queued"] is True, consolidation
    run_id = consolidation["result"]["runId"]
    # A retry of every remember answers from the idempotency records.
    for i, content in enumerate(contents):
        again = await _write(switched, "remember", {"content": content, "topic": "racks", "type": "fact", "workspace": ws,
                                                   "idempotencyKey": f"{ws}-{i}"}, timings)
        assert again["result"] == {"success": True, "id": remembered[i], "idempotent": True}, again
    # The read path keeps working too; tool_feedback lands the queued recall effects first,
    # and with the effects queue in a hung Redis that must not fail the feedback.
    found = await _read(switched, "recall", {"text": "how many storage nodes does each drill rack host", "workspace": ws})
    assert found.get("isError") is False and set(remembered[1:5]) & {f["id"] for f in found["result"]["fragments"]}, found
    feedback = await _read(switched, "tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True,
                                                       "fragment_ids": remembered[1:3]})
    assert feedback.get("isError") is False and feedback["result"]["success"] is True, feedback
    print(f"\nwrites with Redis hung: {len(timings)}, mean {1000 * sum(timings) / len(timings):.0f} ms, "
          f"max {1000 * max(timings):.0f} ms (one write with Redis up: {1000 * up:.0f} ms)")

    async with db(switched.database_url) as conn:
        stored = await conn.fetch("SELECT content, count(*) AS n FROM fragments WHERE workspace = $1 GROUP BY content", ws)
        assert {r["content"]: r["n"] for r in stored if r["content"] in contents[1:5]} == dict.fromkeys(contents[1:5], 1)

        # Automatic links do not wait for the broker: the relay makes them in ingest meanwhile.
        async def links_made() -> bool:
            return not await conn.fetchval(
                "SELECT count(*) FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", remembered[1:5])

        assert await _until(links_made)
        waiting = await conn.fetchval("SELECT count(*) FROM job_outbox WHERE task = 'maintenance.consolidate' "
                                      "AND (kwargs->>'run_id')::bigint = $1", run_id)
        assert waiting == 1
        assert await conn.fetchval("SELECT status FROM maintenance_runs WHERE id = $1", run_id) == "queued"

        redis_switch.set("up")
        recovered = time.monotonic()

        async def run_finished() -> str | None:
            status = await conn.fetchval("SELECT status FROM maintenance_runs WHERE id = $1", run_id)
            return status if status not in ("queued", "running") else None

        assert await _until(run_finished) == "succeeded"
        print(f"the queued consolidation finished {time.monotonic() - recovered:.1f} s after Redis answered again")

        # And the relay sends again: a new write's link job reaches the worker.
        first = await _write(switched, "remember", {"content": "The drill's object store keeps 3 replicas per bucket.",
                                                    "topic": "storage", "type": "fact", "workspace": ws}, timings)
        second = await _write(switched, "remember", {"content": "Every bucket in the drill's object store has three replicas.",
                                                     "topic": "storage", "type": "fact", "workspace": ws}, timings)

        async def linked_and_drained() -> bool:
            return bool(await conn.fetchval(
                "SELECT count(*) FROM fragment_links WHERE from_id = $1 AND to_id = $2", second["result"]["id"], first["result"]["id"],
            )) and not await conn.fetchval("SELECT count(*) FROM job_outbox")

        assert await _until(linked_and_drained)


async def test_jobs_left_by_a_dead_ingest_are_relayed_by_the_worker(switched: Stack, redis_switch: RedisSwitch) -> None:
    """A write's job outlives its ingest process: the row a dead ingest committed but never
    relayed is sent by beat's maintenance.outbox_relay (here sent as beat would), and the
    worker runs it."""
    redis_switch.set("up")
    ingest = switched.processes["ingest"]
    ingest.stop()  # no relay of its own is left to take the row
    try:
        async with db(switched.database_url) as conn:
            async with conn.transaction():  # what a memory_consolidate commits before its process dies
                run_id = await runs_repo.create_run(conn, "consolidate", Tenant(), {"trigger": "test"})
                await outbox_repo.insert(conn, broker_key(redis_switch.url), "maintenance.consolidate", QUEUE_MAINTENANCE,
                                         {"run_id": run_id, "tenant": "all", "stages": None}, {})
            producer = celery_client(redis_switch.url)
            await asyncio.to_thread(producer.send_task, "maintenance.outbox_relay", queue=QUEUE_MAINTENANCE)

            async def run_finished() -> str | None:
                status = await conn.fetchval("SELECT status FROM maintenance_runs WHERE id = $1", run_id)
                return status if status not in ("queued", "running") else None

            assert await _until(run_finished) == "succeeded"
            assert await conn.fetchval("SELECT count(*) FROM job_outbox") == 0
    finally:
        ingest.start()
