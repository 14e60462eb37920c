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
from datetime import timedelta
from typing import Any

import httpx
from celery.signals import worker_ready
from pydantic import AliasChoices, Field, field_validator
from redis.asyncio import Redis

from services.common.internal import SERVICE_TOKEN_HEADER
from services.maintenance.celery_app import app
from services.maintenance.runtime import runtime
from shared.jobs import QUEUE_BATCH
from shared.repositories.batch_jobs import BatchQueue, Claimed
from shared.settings import CommonSettings, seconds_or_duration
from shared.telemetry import inject_headers

logger = logging.getLogger(__name__)


class BatchWorkerSettings(CommonSettings):
    ingest_url: str = Field(
        "http://127.0.0.1:57334", validation_alias=AliasChoices("ENGRAM_BATCH_INGEST_URL", "INGEST_URL")
    )
    # A job held longer than this without progress is taken to belong to a dead consumer.
    # One chunk takes ~0.3 s to store here (50 fragments with embeddings), so a minute is
    # generous even on a loaded machine.
    lease: timedelta = Field(timedelta(seconds=60), alias="ENGRAM_BATCH_LEASE")
    recover_interval: timedelta = Field(timedelta(seconds=30), alias="ENGRAM_BATCH_RECOVER_INTERVAL")
    # Fragments per ingest call: progress is committed (and survives a crash) per chunk.
    chunk: int = Field(50, alias="ENGRAM_BATCH_CHUNK", ge=1, le=200)
    # Jobs per task run before the run re-enqueues itself (bounded runs, STYLE 7).
    jobs_per_run: int = Field(20, alias="ENGRAM_BATCH_JOBS_PER_RUN", ge=1)


    @field_validator("lease", "recover_interval", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return seconds_or_duration(value)


class IngestUnavailable(Exception):
    """The ingest service could not take the chunk now; the job is retried later."""


def _settings() -> BatchWorkerSettings:
    return BatchWorkerSettings()


async def _store_chunk(
    http: httpx.AsyncClient, settings: BatchWorkerSettings, payload: dict[str, Any], items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    body = {
        "arguments": {"fragments": items, "workspace": payload.get("workspace"), "agentId": payload.get("agentId")},
        "principal": payload["principal"],
        "session": payload.get("session"),
    }
    headers = inject_headers({SERVICE_TOKEN_HEADER: settings.service_token})
    try:
        response = await http.post(f"{settings.ingest_url}/v1/tools/batch_remember", json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise IngestUnavailable(f"ingest unreachable: {exc.__class__.__name__}") from exc
    if response.status_code == 422:
        # The write path refused the whole call (never expected: items were validated when
        # queued). Not retryable: the chunk's items count as failed.
        logger.error("ingest refused a batch chunk: %s", response.text[:500])
        return [{"success": False} for _ in items]
    if response.status_code >= 400:
        raise IngestUnavailable(f"ingest answered {response.status_code}")
    return list(response.json()["result"]["results"])


async def process(queue: BatchQueue, http: httpx.AsyncClient, settings: BatchWorkerSettings, job: Claimed) -> str:
    """Store one claimed job from its cursor on; returns its final state for this run."""
    items = job.payload["items"]
    cursor, processed, failed = job.cursor, job.processed, job.failed
    try:
        while cursor < len(items):
            chunk = items[cursor:cursor + settings.chunk]
            results = await _store_chunk(http, settings, job.payload, [c["item"] for c in chunk])
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
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=2)) as http:
            while handled < settings.jobs_per_run:
                job = await queue.claim()
                if job is None:
                    break
                await process(queue, http, settings, job)
                handled += 1
        return handled, await queue.pending() > 0
    finally:
        await redis.aclose()


def _run() -> int:
    settings = _settings()
    handled, more = runtime().loop.run_until_complete(drain(settings))
    if more:
        batch_remember.apply_async(queue=QUEUE_BATCH)
    return handled


@app.task(name="maintenance.batch_remember")
def batch_remember(job_id: str | None = None) -> int:
    """Woken by ingest after it queued job_id; drains whatever is queued."""
    return _run()


@app.task(name="maintenance.batch_recover")
def batch_recover() -> int:
    return _run()


app.add_periodic_task(
    _settings().recover_interval.total_seconds(), batch_recover.s(), name="maintenance.batch_recover", queue=QUEUE_BATCH
)


@worker_ready.connect
def _recover_on_start(sender: Any = None, **_: Any) -> None:
    """A restarted worker takes back what a crashed one held, without waiting for beat."""
    try:
        app.send_task("maintenance.batch_recover", queue=QUEUE_BATCH)
    except Exception:  # kombu raises several transport errors; beat recovers later anyway
        logger.warning("could not schedule batch recovery at start-up", exc_info=True)
