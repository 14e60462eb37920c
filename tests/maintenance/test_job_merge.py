"""The relay's merge of link jobs (shared.jobs.merge_jobs) and its linger: a run of single
writes (remember after remember) records one link row each, and Celery's own work is ~4 ms of
the worker's CPU a task whatever its size, on the cores the next write's model runs on. The
relay, woken by a commit, waits ENGRAM_OUTBOX_LINGER and sends the link rows it then claims as
one job; every row is still deleted only with the job that covers it sent, or run inline."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from shared.db import create_pool
from shared.job_relay import OutboxRelay, drain_once
from shared.jobs import LINK_CHUNK, LINK_TASK, QUEUE_BATCH, QUEUE_MAINTENANCE, merge_jobs
from shared.repositories import outbox as outbox_repo
from shared.repositories.outbox import OutboxJob
from tests.support import Stack


def _link(row: int, ids: list[str], queue: str = QUEUE_BATCH, **extra: Any) -> OutboxJob:
    return OutboxJob(row, LINK_TASK, queue, {"fragment_ids": ids, **extra}, {"traceparent": f"t{row}"})


def test_link_rows_are_joined_up_to_the_piece_size_and_nothing_else_is() -> None:
    fsck = OutboxJob(2, "maintenance.fsck", QUEUE_MAINTENANCE, {"run_id": 7}, {})
    rows = [
        _link(1, ["a"]), fsck, _link(3, ["b", "c"]),
        _link(4, ["d"], queue=QUEUE_MAINTENANCE),  # another queue: its own job
        _link(5, ["e"], note="x"),  # other arguments differ: its own job
        _link(6, ["f"]),
    ]
    merged = merge_jobs(rows)
    assert [(job.task, job.queue, job.kwargs, covered) for job, covered in merged] == [
        (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["a", "b", "c", "f"]}, [1, 3, 6]),
        ("maintenance.fsck", QUEUE_MAINTENANCE, {"run_id": 7}, [2]),
        (LINK_TASK, QUEUE_MAINTENANCE, {"fragment_ids": ["d"]}, [4]),
        (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["e"], "note": "x"}, [5]),
    ]
    assert merged[0][0].headers == {"traceparent": "t1"} and merged[0][0].id == 1  # the first row's
    assert rows[0].kwargs == {"fragment_ids": ["a"]}  # the claimed rows are not changed

    # Never past LINK_CHUNK ids a job (split_job's pieces stay short turns on the worker).
    full = [_link(n, [f"id-{n}-{k}" for k in range(LINK_CHUNK // 2)]) for n in range(1, 4)]
    sizes = [(len(job.kwargs["fragment_ids"]), covered) for job, covered in merge_jobs(full)]
    assert sizes == [(LINK_CHUNK, [1, 2]), (LINK_CHUNK // 2, [3])]


async def _record(pool: asyncpg.Pool, broker: str, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    async with pool.acquire() as conn:
        for task, queue, kwargs in rows:
            await outbox_repo.insert(conn, broker, task, queue, kwargs, {})


async def _left(pool: asyncpg.Pool, broker: str) -> list[str]:
    async with pool.acquire() as conn:
        return [r["task"] for r in await conn.fetch("SELECT task FROM job_outbox WHERE broker = $1 ORDER BY id", broker)]


async def test_a_claim_sends_its_link_rows_as_one_job_and_deletes_every_row(stack: Stack) -> None:
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    broker = "merge-test-sent"
    sends: list[list[OutboxJob]] = []

    def send(jobs: list[OutboxJob]) -> int:
        sends.append(jobs)
        return len(jobs)

    try:
        await _record(pool, broker, [
            (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["a"]}), ("maintenance.fsck", QUEUE_MAINTENANCE, {"run_id": 1}),
            (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["b"]}), (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["c"]}),
        ])
        drained = await drain_once(pool, broker, send)
        assert drained.done == 4 and not drained.refused
        assert [[(job.task, job.kwargs) for job in jobs] for jobs in sends] == [
            [(LINK_TASK, {"fragment_ids": ["a", "b", "c"]}), ("maintenance.fsck", {"run_id": 1})],
        ]
        assert await _left(pool, broker) == []
    finally:
        await pool.close()


async def test_a_refused_merged_link_job_runs_inline_once_for_all_its_rows(stack: Stack) -> None:
    """The broker refuses the first job: the link rows it covered run inline as one call and
    are deleted; the job with no inline path keeps its row for the next try."""
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    broker = "merge-test-refused"
    ran: list[dict[str, Any]] = []

    async def link_inline(conn: asyncpg.Connection, kwargs: dict[str, Any]) -> None:
        ran.append(kwargs)

    try:
        await _record(pool, broker, [
            (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["a"]}), ("maintenance.fsck", QUEUE_MAINTENANCE, {"run_id": 1}),
            (LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["b"]}),
        ])
        drained = await drain_once(pool, broker, lambda jobs: 0, inline={LINK_TASK: link_inline})
        assert drained.done == 2 and drained.refused
        assert ran == [{"fragment_ids": ["a", "b"]}]
        assert await _left(pool, broker) == ["maintenance.fsck"]
    finally:
        await pool.close()


async def test_the_relay_woken_by_a_commit_sends_the_writes_of_its_linger_together(stack: Stack) -> None:
    """Two writes' link rows, the second committed while the relay lingers after the first's
    wake: one send, one link job for both. (The linger is long next to the ms between the two
    commits, so the grouping does not depend on the machine's speed.)"""
    pool = await create_pool(stack.database_url, min_size=1, max_size=3)
    broker = "merge-test-linger"
    sends: list[list[OutboxJob]] = []
    sent = asyncio.Event()

    def send(jobs: list[OutboxJob]) -> int:
        sends.append(jobs)
        sent.set()
        return len(jobs)

    relay = OutboxRelay(pool, broker, send, poll=60.0, backoff_max=1.0, linger=1.5)
    running = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.2)  # its first look found nothing; it waits for a wake
        await _record(pool, broker, [(LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["first"]})])
        relay.wake()
        await asyncio.sleep(0.05)
        await _record(pool, broker, [(LINK_TASK, QUEUE_BATCH, {"fragment_ids": ["second"]})])
        relay.wake()
        await asyncio.wait_for(sent.wait(), timeout=30)
        assert [[job.kwargs for job in jobs] for jobs in sends] == [[{"fragment_ids": ["first", "second"]}]]
        for _ in range(100):  # the rows go with the claim's commit, just after the send
            if not await _left(pool, broker):
                break
            await asyncio.sleep(0.05)
        assert await _left(pool, broker) == []
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await pool.close()
