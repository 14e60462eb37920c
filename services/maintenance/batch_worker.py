"""Consumer of the async batch_remember queue (seed: BatchRememberWorker).

Jobs wait on a reliable Redis queue (shared/repositories/batch_jobs.py). A consumer run
claims one job at a time (LMOVE into `processing`), stores it in chunks through the ingest
service's own batch_remember (the write path with its validation, secret screening, quota
and embeddings), records progress after each committed chunk and acknowledges the job only
when every chunk is stored. Every item carries an idempotency key (jobId#index), so a job
taken over after a crash stores nothing twice.

Runs are started by ingest right after it queued a job (`maintenance.batch_remember`), by
the worker once it is ready, and periodically by beat (`maintenance.batch_recover`), which
also puts jobs whose consumer died (lease run out) back on the queue.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready
from redis.asyncio import Redis

from services.common.rpc import InternalClient
from services.maintenance.celery_app import app
from services.maintenance.runtime import runtime
from shared.domain.errors import EngramError, InvalidParams, PolicyViolation, Unavailable
from shared.jobs import QUEUE_BATCH, send_job
from shared.repositories.batch_jobs import BatchQueue, Claimed
from shared.settings import BatchWorkerSettings

logger = logging.getLogger(__name__)

BATCH_REMEMBER_TASK = "maintenance.batch_remember"
BATCH_RECOVER_TASK = "maintenance.batch_recover"
# One ingest call stores a chunk with its embeddings: ~0.3 s here, minutes on a cold model
# under load are still an answer worth waiting for.
INGEST_TIMEOUT = 120.0


class IngestUnavailable(Exception):
    """The ingest service could not take the chunk now; the job is retried later."""


def _settings() -> BatchWorkerSettings:
    return BatchWorkerSettings()


async def _store_chunk(ingest: InternalClient, payload: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    arguments = {"fragments": items, "workspace": payload.get("workspace"), "agentId": payload.get("agentId")}
    try:
        result, _ = await ingest.call("ingest", "batch_remember", arguments, payload["principal"], payload.get("session"))
    except Unavailable as exc:
        raise IngestUnavailable(f"ingest unreachable: {exc.message}") from exc
    except (InvalidParams, PolicyViolation) as exc:
        # The write path refused the whole call (never expected: items were validated when
        # queued). Not retryable: the chunk's items count as failed.
        logger.error("ingest refused a batch chunk: %s", exc.message[:500])
        return [{"success": False} for _ in items]
    except EngramError as exc:
        raise IngestUnavailable(f"ingest answered {exc.code}: {exc.message[:200]}") from exc
    return list(result["results"])


async def process(queue: BatchQueue, ingest: InternalClient, settings: BatchWorkerSettings, job: Claimed) -> str:
    """Store one claimed job from its cursor on; returns its final state for this run."""
    items = job.payload["items"]
    cursor, processed, failed = job.cursor, job.processed, job.failed
    try:
        while cursor < len(items):
            chunk = items[cursor:cursor + settings.chunk]
            results = await _store_chunk(ingest, job.payload, [c["item"] for c in chunk])
            ok = sum(1 for r in results if r.get("success"))
            processed += ok
            failed += len(chunk) - ok
            cursor += len(chunk)
            await queue.progress(job.job_id, cursor=cursor, processed=processed, failed=failed)
    except IngestUnavailable as exc:
        dead = await queue.retry_later(job.job_id, job.attempts, str(exc))
        logger.warning("batch job %s attempt %d failed (%s)%s", job.job_id, job.attempts, exc, "; dead-lettered" if dead else "")
        return "dead" if dead else "retry"
    await queue.complete(job.job_id)
    logger.info("batch job %s completed: %d processed, %d failed", job.job_id, processed, failed)
    return "completed"


async def drain(settings: BatchWorkerSettings, prefix: str | None = None) -> tuple[int, bool]:
    """Recover stale jobs, then process queued ones; returns (jobs handled, more waiting)."""
    redis = Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=10)
    lease = settings.lease.total_seconds()
    queue = BatchQueue(redis, prefix, lease_seconds=lease) if prefix else BatchQueue(redis, lease_seconds=lease)
    handled = 0
    try:
        recovered = await queue.recover()
        if recovered:
            logger.info("requeued batch jobs whose consumer stopped: %s", recovered)
        ingest = InternalClient({"ingest": InternalClient.replicas(settings.ingest_url)}, settings.service_token, INGEST_TIMEOUT)
        async with ingest:
            while handled < settings.jobs_per_run:
                job = await queue.claim()
                if job is None:
                    break
                await process(queue, ingest, settings, job)
                handled += 1
        return handled, await queue.pending() > 0
    finally:
        await redis.aclose()


def _run() -> int:
    settings = _settings()
    handled, more = runtime().loop.run_until_complete(drain(settings))
    if more:  # a refused send waits for beat's batch_recover
        send_job(app, BATCH_REMEMBER_TASK, queue=QUEUE_BATCH)
    return handled


@app.task(name=BATCH_REMEMBER_TASK)
def batch_remember(job_id: str | None = None) -> int:
    """Woken by ingest after it queued job_id; drains whatever is queued."""
    return _run()


@app.task(name=BATCH_RECOVER_TASK)
def batch_recover() -> int:
    return _run()


app.add_periodic_task(
    _settings().recover_interval.total_seconds(), batch_recover.s(), name=BATCH_RECOVER_TASK, queue=QUEUE_BATCH
)


@worker_ready.connect
def _recover_on_start(sender: Any = None, **_: Any) -> None:
    """A restarted worker takes back what a crashed one held, without waiting for beat (a
    refused send is logged by send_job; beat recovers later anyway)."""
    send_job(app, BATCH_RECOVER_TASK, queue=QUEUE_BATCH)
