"""Background jobs from the request path: recorded with the write, sent outside the request.

A job that reads a row must not be sent before the row exists, and a rolled-back write
must send nothing. With Redis, ingest records each job as a row of the job outbox inside
the write's own transaction (JobBuffer.record): the job exists exactly when the write
committed, survives a crash right after the commit, and costs the request one INSERT, never
a broker round trip. shared/job_relay.py sends the rows to Celery from a background task,
woken by the commit, so a job still starts within ENGRAM_OUTBOX_LINGER (the rows of the
writes meanwhile go with it, merged: merge_jobs); while the broker is down the rows wait and
the relay backs off. A best-effort send from the request after the
commit (behind a breaker) was the other option; it saves no latency the relay's wake-up
does not already save, and it would put the broker back in the request whenever the breaker
is closed but Redis has just died. Without Redis (REDIS_ENABLED=false) the jobs stay in the
buffer and ingest runs them inline after the commit.

Jobs are addressed by dotted task name, so the sender never imports the worker's code.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg
from celery import Celery
from kombu.exceptions import KombuError
from prometheus_client import Counter
from redis.exceptions import RedisError

from shared.repositories import outbox as outbox_repo
from shared.repositories.outbox import OutboxJob
from shared.telemetry import inject_headers, recorded_context

logger = logging.getLogger(__name__)

JOBS_SENT = Counter("engram_jobs_enqueued_total", "Background jobs enqueued", ["task", "outcome"])

QUEUE_MAINTENANCE = "maintenance"
QUEUE_BATCH = "batch"
# Bulk background work goes to the batch queue: batch_remember's chunks, and the graph links of
# every write. A large import records one link job per batch of fragments (~5 s each for 768
# at 2 cores), dozens in a row; on the maintenance queue they held a check or a consolidation
# asked for through the API behind them for minutes (a clean-clone CI run's /api/fsck waited
# past 180 s). kombu's Redis transport serves a worker's queues round robin (the queue a
# message came from moves to the back), so the two queues take turns.
LINK_TASK = "maintenance.link_new_fragments"
TASK_QUEUES = {LINK_TASK: QUEUE_BATCH}
# Taking turns only helps if a turn is short: a link job of a whole import batch (768 ids) took
# ~5 s on a loaded CI machine, and a consolidation with four maintenance jobs ahead of it then
# waited past memory_consolidate's 25 s. A task listed here is sent as jobs of at most this
# many items of that list argument.
LINK_CHUNK = 128
TASK_PIECES = {LINK_TASK: ("fragment_ids", LINK_CHUNK)}


def queue_of(task: str) -> str:
    """The queue a task is sent to when its sender does not name one."""
    return TASK_QUEUES.get(task, QUEUE_MAINTENANCE)


def split_job(task: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's kwargs as the jobs actually sent: one job, or TASK_PIECES' pieces of its list."""
    argument, size = TASK_PIECES.get(task, ("", 0))
    items = kwargs.get(argument)
    if not isinstance(items, list) or len(items) <= size:
        return [kwargs]
    return [{**kwargs, argument: items[i : i + size]} for i in range(0, len(items), size)]


def merge_jobs(jobs: list[OutboxJob]) -> list[tuple[OutboxJob, list[int]]]:
    """split_job's inverse for the relay: rows of a TASK_PIECES task with the same queue and
    the same other arguments sent as one job of their lists joined, up to the piece size, at
    the first row's place (with its trace headers); each job with the outbox rows it covers.
    A link job is ~4 ms of the worker's CPU whatever its size (Celery's own work per task)
    and its statement ~1 ms for one fragment, so the links of a run of single writes go out
    as one job."""
    merged: list[tuple[OutboxJob, list[int]]] = []
    open_jobs: dict[tuple[str, str, str], int] = {}  # (task, queue, other arguments) -> index in merged
    for job in jobs:
        argument, size = TASK_PIECES.get(job.task, ("", 0))
        items = job.kwargs.get(argument)
        if not isinstance(items, list):
            merged.append((job, [job.id]))
            continue
        rest = json.dumps({k: v for k, v in job.kwargs.items() if k != argument}, sort_keys=True, default=str)
        key = (job.task, job.queue, rest)
        at = open_jobs.get(key)
        if at is not None:
            first, rows = merged[at]
            joined = first.kwargs[argument] + items
            if len(joined) <= size:
                merged[at] = (replace(first, kwargs={**first.kwargs, argument: joined}), [*rows, job.id])
                continue
        open_jobs[key] = len(merged)
        merged.append((job, [job.id]))
    return merged


# Connect and read timeout of one send. Measured against a listener that accepts and never
# answers: the old 2 s timeouts plus kombu's connection retries (its transport option
# max_retries, unset = retry) cost ~6 s a send, with the broker refusing or hung alike; with
# these, 0.3 s hung and ~1 ms refused.
SEND_TIMEOUT_S = 0.3


def celery_client(broker_url: str, timeout: float = SEND_TIMEOUT_S) -> Celery:
    """A producer-only Celery app (no task code) whose sends fail within `timeout` when the
    broker is unreachable, never retrying inside the caller."""
    app = Celery("engram-producer", broker=broker_url)
    app.conf.update(
        broker_connection_retry_on_startup=False, broker_connection_retry=False,
        broker_connection_max_retries=0, broker_connection_timeout=timeout,
    )
    app.conf.broker_transport_options = {
        "socket_connect_timeout": timeout, "socket_timeout": timeout, "retry_on_timeout": False, "max_retries": 0,
    }
    return app


def broker_key(broker_url: str) -> str:
    """How outbox rows name the broker they are for: a hash, so no password is stored. The
    same URL string on every process of a deployment (ingest, worker) gives the same key."""
    return hashlib.sha256(broker_url.encode()).hexdigest()[:16]


# What a send raises when the broker is away (kombu wraps most of it in OperationalError).
BROKER_ERRORS = (KombuError, RedisError, OSError)


def send_outbox_jobs(client: Celery, jobs: list[OutboxJob]) -> int:
    """Send jobs in order until the broker refuses one; return how many were sent."""
    for n, job in enumerate(jobs):
        try:
            # Under the request's recorded trace: the send (and the task) join that trace.
            with recorded_context(job.headers):
                client.send_task(job.task, kwargs=job.kwargs, queue=job.queue, headers=dict(job.headers), retry=False)
        except BROKER_ERRORS:
            logger.warning("broker unavailable; %d outbox jobs wait for the next try", len(jobs) - n, exc_info=True)
            JOBS_SENT.labels(job.task, "failed").inc()
            return n
        JOBS_SENT.labels(job.task, "sent").inc()
    return len(jobs)


def send_job(client: Celery, task: str, kwargs: dict[str, Any] | None = None, *, queue: str | None = None) -> bool:
    """The direct send, for a sender with no transaction to record the job in (its row is
    committed already, or it has none): one try, within SEND_TIMEOUT_S on a producer client.
    False when the broker refused it; the caller says what happens to the job then."""
    try:
        client.send_task(task, kwargs=kwargs or {}, queue=queue or queue_of(task), headers=inject_headers({}), retry=False)
    except BROKER_ERRORS:
        logger.warning("could not enqueue %s", task, exc_info=True)
        JOBS_SENT.labels(task, "failed").inc()
        return False
    JOBS_SENT.labels(task, "sent").inc()
    return True


@dataclass
class Job:
    task: str
    kwargs: dict[str, Any]
    queue: str = QUEUE_MAINTENANCE


@dataclass
class JobBuffer:
    """outbox (a broker_key): record() writes jobs to the job outbox in the caller's
    transaction, for that broker's relay. outbox=None (no Redis): record() keeps them here,
    for the caller to run after commit. add() + send() are the direct path of callers
    without a transaction of their own."""

    outbox: str | None = None
    jobs: list[Job] = field(default_factory=list)
    recorded: int = 0

    def add(self, task: str, queue: str | None = None, **kwargs: Any) -> None:
        self.jobs.extend(Job(task, piece, queue or queue_of(task)) for piece in split_job(task, kwargs))

    async def record(self, conn: asyncpg.Connection, task: str, queue: str | None = None, **kwargs: Any) -> None:
        """Inside the write's transaction: the job commits or rolls back with the write."""
        if self.outbox is None:
            self.add(task, queue, **kwargs)
            return
        headers = inject_headers({})
        for piece in split_job(task, kwargs):
            await outbox_repo.insert(conn, self.outbox, task, queue or queue_of(task), piece, headers)
            self.recorded += 1

    def send(self, client: Celery | None) -> list[Job]:
        """Send every buffered job; return those that could not be sent."""
        unsent: list[Job] = []
        for job in self.jobs:
            if client is None or not send_job(client, job.task, job.kwargs, queue=job.queue):
                unsent.append(job)
        self.jobs.clear()
        return unsent
