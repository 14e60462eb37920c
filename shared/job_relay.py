"""The relay of the job outbox: sends the jobs writes recorded (shared/jobs.py) to Celery.

Each ingest process runs one OutboxRelay task. A write wakes it at its commit; it waits
ENGRAM_OUTBOX_LINGER (0.25 s), so the jobs of the writes in that time go in one claim and
the link jobs among them as one job (shared.jobs.merge_jobs), then sends. A job starts within
about that time of its write's reply; an idle look every
ENGRAM_OUTBOX_POLL_INTERVAL takes rows another replica left behind. Rows are claimed FOR
UPDATE SKIP LOCKED, so any number of ingest replicas, and beat's maintenance.outbox_relay
(for rows whose ingest died before relaying them), drain one table without sending a row
twice at once. While the broker refuses, the relay tries it again after 0.5 s, 1 s, 2 s ...
up to ENGRAM_OUTBOX_BACKOFF_MAX, and the rows wait in Postgres; jobs with an inline path
(automatic links: what a write ran inline before there was a relay) run in the relay's
process meanwhile, so a Redis outage delays no link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
from prometheus_client import Gauge

from shared.jobs import merge_jobs
from shared.repositories import outbox as outbox_repo
from shared.repositories.outbox import OutboxJob

logger = logging.getLogger(__name__)

OUTBOX_DEPTH = Gauge("engram_job_outbox_depth", "Background jobs recorded and not yet sent to the broker")

# Rows per claim: a burst of 200 writes relays in a few transactions, and a broker that
# died mid-batch holds at most this many rows locked for one send timeout.
BATCH = 100
FIRST_BACKOFF_S = 0.5

Sender = Callable[[list[OutboxJob]], int]  # sends in order; returns how many were sent
# Jobs the relay's own process can run when the broker refuses them (run in the relay's
# transaction): what the request path used to run inline, now outside the request.
Inline = dict[str, Callable[[asyncpg.Connection, dict[str, Any]], Awaitable[Any]]]


@dataclass(frozen=True)
class Drained:
    done: int  # rows sent or run inline, and deleted
    refused: bool  # the broker refused a send


async def drain_once(
    pool: asyncpg.Pool, broker: str, send: Sender, *, limit: int = BATCH, inline: Inline | None = None,
    try_broker: bool = True,
) -> Drained:
    """Claim up to `limit` of this broker's rows (a broker_key), send them (merged where
    merge_jobs joins them; in a thread: kombu is blocking), run inline what the broker
    refused and has an inline path, delete what is done. try_broker=False: only the rows
    with an inline path, without trying the broker (it is known to be down)."""
    inline = inline or {}
    async with pool.acquire() as conn, conn.transaction():
        rows = await outbox_repo.claim(conn, broker, limit, None if try_broker else list(inline))
        if not rows:
            return Drained(0, False)
        jobs = merge_jobs(rows)
        sent = await anyio.to_thread.run_sync(send, [job for job, _ in jobs]) if try_broker else 0
        done = [row for _, covered in jobs[:sent] for row in covered]
        for job, covered in jobs[sent:]:
            run = inline.get(job.task)
            if run is not None:
                await run(conn, job.kwargs)
                done.extend(covered)
        await outbox_repo.delete(conn, done)
    return Drained(len(done), try_broker and sent < len(jobs))


async def drain(pool: asyncpg.Pool, broker: str, send: Sender, max_batches: int = 50) -> int:
    """Batches until the outbox is empty, the broker refuses, or max_batches (a bounded run
    for a periodic task). Returns the rows sent."""
    total = 0
    for _ in range(max_batches):
        batch = await drain_once(pool, broker, send)
        total += batch.done
        if batch.refused or batch.done < BATCH:
            break
    return total


class OutboxRelay:
    def __init__(
        self, pool: asyncpg.Pool, broker: str, send: Sender, *, poll: float, backoff_max: float,
        inline: Inline | None = None, linger: float = 0.0,
    ) -> None:
        self._pool = pool
        self.broker = broker  # the broker_key of the rows this relay sends
        self._send = send
        self._inline = inline or {}
        self._poll = poll
        self._backoff_max = backoff_max
        self._linger = linger
        self._wake = asyncio.Event()
        self._retry_at = 0.0
        self.failures = 0  # consecutive tries the broker refused

    def wake(self) -> None:
        """A write committed jobs: relay them now rather than at the next poll."""
        self._wake.set()

    @property
    def broker_down(self) -> bool:
        return self.failures > 0

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before the claim: a commit after it wakes the next round
            # While backing off, a wake runs the inline-capable jobs and leaves the broker be.
            try_broker = time.monotonic() >= self._retry_at
            try:
                batch = await drain_once(self._pool, self.broker, self._send, inline=self._inline, try_broker=try_broker)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                logger.warning("job outbox relay: the database is unavailable; retrying", exc_info=True)
                await asyncio.sleep(self._poll)
                continue
            except Exception:  # the relay task's top level: a bug must not end relaying for the process's life
                logger.exception("job outbox relay failed; retrying")
                await asyncio.sleep(self._poll)
                continue
            if batch.refused:
                self.failures += 1
                self._retry_at = time.monotonic() + min(self._backoff_max, FIRST_BACKOFF_S * 2 ** (self.failures - 1))
                await self._measure_depth()
            elif try_broker and self.failures:
                logger.info("job outbox relay: the broker takes jobs again")
                self.failures = 0
            if batch.done == BATCH:
                continue
            timeout = self._poll if not self.failures else max(0.0, min(self._poll, self._retry_at - time.monotonic()))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            except TimeoutError:
                if not self.failures:
                    await self._measure_depth()
            else:
                # Woken by a commit: the writes of the next moments go in the same claim.
                await asyncio.sleep(self._linger)

    async def _measure_depth(self) -> None:
        try:
            async with self._pool.acquire() as conn:
                OUTBOX_DEPTH.set(await outbox_repo.depth(conn, self.broker))
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            logger.warning("job outbox relay: could not measure the outbox", exc_info=True)
