"""Which queue a job goes to. The graph links of every write are bulk background work: a large
import records one link job per batch (seconds each), dozens in a row, and on the maintenance
queue they held an fsck or a consolidation asked for through the API behind them for minutes.
They go to the batch queue, which the worker serves in turn with the maintenance queue."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg

from services.maintenance.celery_app import app
from shared.db import SEARCH_PATH
from shared.jobs import LINK_CHUNK, LINK_TASK, QUEUE_BATCH, QUEUE_MAINTENANCE, TASK_QUEUES, JobBuffer, queue_of
from tests.support import Stack

ROOT = Path(__file__).resolve().parents[2]


async def test_a_writes_link_job_is_recorded_for_the_batch_queue(stack: Stack) -> None:
    """As ingest records it, inside the write's transaction (rolled back here, so no relay
    sends it): the outbox row names the batch queue; a check or consolidation stays on
    maintenance, and a sender that names a queue keeps it."""
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        async with conn.transaction():
            jobs = JobBuffer(outbox="queue-test")
            await jobs.record(conn, LINK_TASK, fragment_ids=["frag-a", "frag-b"])
            await jobs.record(conn, "maintenance.fsck", run_id=1)
            await jobs.record(conn, "maintenance.consolidate", queue=QUEUE_BATCH)
            rows = await conn.fetch("SELECT task, queue FROM job_outbox WHERE broker = 'queue-test' ORDER BY id")
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()
    assert [(r["task"], r["queue"]) for r in rows] == [
        (LINK_TASK, QUEUE_BATCH), ("maintenance.fsck", QUEUE_MAINTENANCE), ("maintenance.consolidate", QUEUE_BATCH),
    ]
    buffered = JobBuffer()  # no Redis: kept for the caller to run inline, with the same queue
    buffered.add(LINK_TASK, fragment_ids=["frag-a"])
    assert [job.queue for job in buffered.jobs] == [QUEUE_BATCH] == [queue_of(LINK_TASK)]


async def test_a_large_link_job_is_recorded_in_short_pieces(stack: Stack) -> None:
    """An import batch's link job becomes jobs of at most LINK_CHUNK fragments each (short
    turns on the worker), every id in exactly one of them, in order, in the same transaction."""
    ids = [f"frag-{n:05d}" for n in range(2 * LINK_CHUNK + 5)]
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        async with conn.transaction():
            jobs = JobBuffer(outbox="chunk-test")
            await jobs.record(conn, LINK_TASK, fragment_ids=ids)
            rows = await conn.fetch("SELECT queue, kwargs FROM job_outbox WHERE broker = 'chunk-test' ORDER BY id")
            recorded = jobs.recorded
            raise _RollBack
    except _RollBack:
        pass
    finally:
        await conn.close()
    pieces = [json.loads(r["kwargs"])["fragment_ids"] for r in rows]
    assert [len(p) for p in pieces] == [LINK_CHUNK, LINK_CHUNK, 5] and recorded == 3
    assert [i for piece in pieces for i in piece] == ids
    assert {r["queue"] for r in rows} == {QUEUE_BATCH}


def test_every_worker_consumes_every_routed_queue() -> None:
    """A routed job is only served if every way the worker is started listens on its queue."""
    routed = {QUEUE_MAINTENANCE, *TASK_QUEUES.values()}
    assert routed <= {q.name for q in app.conf.task_queues}
    for path in ("services/stack/supervisor.py", "docker-compose.yml", "deploy/k8s/base/worker.yaml"):
        listed = re.findall(r'"-Q",\s*"([^"]+)"', (ROOT / path).read_text())
        assert listed, path
        for queues in listed:
            assert routed <= set(queues.split(",")), (path, queues)


class _RollBack(Exception):
    pass
