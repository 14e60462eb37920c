"""Celery tasks: open the runtime, call a plain function in service.py, return.

Every task is idempotent (acks_late redelivers after a crash): runs are claimed by id,
stages are rerun-safe, reflect is locked per session and checks reflected_at.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from services.maintenance import fsck as fsck_service
from services.maintenance import reflect, service
from services.maintenance.celery_app import app, settings
from services.maintenance.runtime import runtime
from shared import job_relay
from shared.jobs import LINK_TASK, broker_key, send_job, send_outbox_jobs

# Lost connections and an unreachable ingest are worth retrying; a bug is not.
RETRYABLE = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)
RETRY = {"retry_backoff": 5, "retry_backoff_max": 300, "retry_jitter": True, "max_retries": 3}


@app.task(name=LINK_TASK, autoretry_for=RETRYABLE, **RETRY)
def link_new_fragments(fragment_ids: list[str]) -> int:
    return runtime().run(lambda pool: service.link_new_fragments(pool, fragment_ids))


@app.task(name="maintenance.link_sweep", autoretry_for=RETRYABLE, **RETRY)
def link_sweep() -> int:
    return runtime().run(service.link_sweep)


@app.task(name="maintenance.visibility_vacuum", autoretry_for=RETRYABLE, **RETRY)
def visibility_vacuum() -> dict[str, int]:
    return runtime().run(service.visibility_vacuum)


@app.task(name="maintenance.type_graphs", autoretry_for=RETRYABLE, **RETRY)
def type_graphs() -> list[str]:
    rt = runtime()
    return rt.run(lambda pool: service.type_graphs(pool, rt.settings.type_graph_min_rows))


@app.task(name="maintenance.vector_cells", autoretry_for=RETRYABLE, **RETRY)
def vector_cells() -> int | None:
    rt = runtime()
    s = rt.settings
    return rt.run(lambda pool: service.vector_cells(pool, s.vector_cells_min_rows, s.vector_cells_retrain_growth))


@app.task(name="maintenance.consolidate", autoretry_for=RETRYABLE, **RETRY)
def consolidate(run_id: int | None = None, tenant: str | None = None, stages: list[str] | None = None) -> dict[str, Any]:
    """run_id: a maintenance_runs row made by the caller (memory_consolidate); without it
    (beat) the task makes its own. tenant: 'all' (default), 'master' or 'key:<id>'."""
    rt = runtime()
    return rt.run(lambda _pool: service.consolidate(rt, run_id=run_id, tenant=tenant, stages=stages, scheduled=run_id is None))


@app.task(name="maintenance.embedding_backfill", autoretry_for=RETRYABLE, **RETRY)
def embedding_backfill() -> dict[str, Any]:
    """The backfill stages alone, more often than the full cycle (a fragment stored while the
    model was unavailable should not wait 6 hours to become searchable by meaning; the
    passages of fragments stored before they existed drain 2,000 fragments a run)."""
    rt = runtime()
    return rt.run(lambda _pool: service.consolidate(
        rt, run_id=None, tenant="all", stages=["embedding_backfill", "passage_backfill"], scheduled=True,
        job="embedding_backfill",
    ))


@app.task(name="maintenance.auto_reflect", autoretry_for=(*RETRYABLE, reflect.ReflectFailed), **RETRY)
def auto_reflect(session_id: str, key_id: str | None = None, reason: str | None = None) -> dict[str, Any]:
    rt = runtime()
    return rt.run(lambda _pool: reflect.auto_reflect(rt, session_id=session_id, key_id=key_id, reason=reason))


@app.task(name="maintenance.reflect_sweep", autoretry_for=RETRYABLE, **RETRY)
def reflect_sweep() -> int:
    """Ended sessions whose reflect job was lost or failed: one auto_reflect task each (one
    the broker refuses is still unreflected at the next sweep). Returns the jobs sent."""
    rt = runtime()
    pending = rt.run(lambda _pool: reflect.unreflected(rt))
    return sum(send_job(app, auto_reflect.name, kwargs) for kwargs in pending)


@app.task(name="maintenance.outbox_relay", autoretry_for=RETRYABLE, **RETRY)
def outbox_relay() -> int:
    """Jobs recorded by an ingest process that died before relaying them (every ingest
    relays its own at once; this is the backstop). Bounded: 50 batches a run."""
    broker = broker_key(settings.broker_url or settings.redis_url)
    return runtime().run(lambda pool: job_relay.drain(pool, broker, lambda jobs: send_outbox_jobs(app, jobs)))


@app.task(name="maintenance.fsck", autoretry_for=RETRYABLE, **RETRY)
def fsck(run_id: int | None = None, tenant: str | None = None, incremental: bool = False) -> dict[str, Any]:
    """A memory check for review (admin API); issues are kept, nothing is applied."""
    rt = runtime()
    return rt.run(lambda _pool: fsck_service.run_fsck(rt, run_id=run_id, tenant=tenant, incremental=incremental, auto_apply=False))


@app.task(name="maintenance.auto_fsck", autoretry_for=RETRYABLE, **RETRY)
def auto_fsck(run_id: int | None = None, tenant: str | None = None) -> dict[str, Any]:
    """Incremental check that applies fixes above FSCK_AUTO_MIN_CONFIDENCE / _SEVERITY; from
    beat (no run, no tenant) one run per tenant."""
    rt = runtime()
    if run_id is None and tenant is None:
        return rt.run(lambda _pool: fsck_service.auto_fsck_every_tenant(rt))
    return rt.run(lambda _pool: fsck_service.run_fsck(rt, run_id=run_id, tenant=tenant, incremental=True, auto_apply=True))
