"""Maintenance jobs as plain async functions; the Celery tasks are thin.

Each job that an operator or tool may wait on records itself in maintenance_runs: the row
is claimed (queued -> running), the work is done in bounded stages, the row is finished
with the report or the error.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from opentelemetry import trace
from redis.exceptions import RedisError

from services.maintenance.pipeline import STAGE_NAMES, CycleContext, run_cycle
from services.maintenance.runtime import WorkerRuntime
from shared.recall_cache import bump_recall_generation
from shared.repositories import links as links_repo
from shared.repositories import locks as locks_repo
from shared.repositories import maintenance as runs_repo
from shared.repositories import type_graphs as type_graphs_repo
from shared.repositories import vector_cells as vector_cells_repo
from shared.repositories.maintenance import Tenant
from shared.telemetry import correlation_id

logger = logging.getLogger(__name__)

# 500 fragments per sweep: one LATERAL kNN query each (~2 ms with HNSW), ~1 s of work.
LINK_SWEEP_BATCH = 500


async def link_new_fragments(pool: asyncpg.Pool, fragment_ids: list[str]) -> int:
    async with pool.acquire() as conn, conn.transaction():
        return await links_repo.auto_link(conn, fragment_ids)


async def link_sweep(pool: asyncpg.Pool) -> int:
    """Fragments whose post-commit link job was never delivered get linked here."""
    async with pool.acquire() as conn:
        ids = await links_repo.unlinked_fragment_ids(conn, LINK_SWEEP_BATCH)
    if not ids:
        return 0
    return await link_new_fragments(pool, ids)


async def visibility_vacuum(pool: asyncpg.Pool) -> dict[str, int]:
    """fragments vacuumed so its visibility map keeps up with the updates recall itself makes
    (shared.repositories.maintenance.vacuum_for_visibility)."""
    async with pool.acquire() as conn:
        state = await runs_repo.vacuum_for_visibility(conn)
    logger.info("visibility vacuum: fragments all-visible %s of %s pages", state["all_visible"], state["pages"])
    return state


async def type_graphs(pool: asyncpg.Pool, min_rows: int) -> list[str]:
    """Each fragment type's own HNSW graph, built once the type has `min_rows` rows
    (shared.repositories.type_graphs)."""
    async with pool.acquire() as conn:
        return await type_graphs_repo.ensure_type_graphs(conn, min_rows)


async def vector_cells(pool: asyncpg.Pool, min_rows: int, retrain_growth: float) -> int | None:
    """The k-means cells index, trained and built once fragments has `min_rows` rows, and
    trained again as it grows `retrain_growth` times (shared.repositories.vector_cells).
    Returns the version built, if one was."""
    async with pool.acquire() as conn:
        return await vector_cells_repo.ensure_cells(conn, min_rows, retrain_growth=retrain_growth)


async def _invalidate_recall_cache(rt: WorkerRuntime) -> None:
    """A cycle rewrites, merges and deletes fragments: cached recalls must not outlive it.
    (Recall also re-checks each cached fragment's updated_at; this drops whole entries.)"""
    if not rt.settings.redis_active:
        return
    client = aioredis.Redis.from_url(rt.settings.redis_url, socket_connect_timeout=2, socket_timeout=2)
    try:
        await bump_recall_generation(client, all_tenants=True)
    except RedisError:
        logger.warning("could not invalidate recall's L1 cache after consolidation", exc_info=True)
    finally:
        await client.aclose()


async def consolidate(
    rt: WorkerRuntime, *, run_id: int | None, tenant: str | None, stages: list[str] | None, scheduled: bool,
    job: str = "consolidate",
) -> dict[str, Any]:
    pool = rt.pool
    if scheduled and not rt.settings.consolidate_enabled:
        return {"skipped": "CONSOLIDATE_ENABLED is false"}
    unknown = sorted(set(stages or ()) - set(STAGE_NAMES))
    if unknown:
        raise ValueError(f"unknown stages: {unknown}")
    async with pool.acquire() as conn:
        if run_id is None:
            run_id = await runs_repo.create_run(
                conn, job, Tenant.parse(tenant), {"stages": stages, "trigger": "beat" if scheduled else "task"}
            )
        claimed = await runs_repo.claim_run(conn, run_id)
    if claimed is None:
        return {"runId": run_id, "skipped": "run already finished"}
    scope = Tenant.parse(claimed["tenant"])
    lock_conn = await pool.acquire()
    try:
        # One lock per job and tenant: two cycles never work one tenant at once.
        lock_name = f"engram.{claimed['job']}:{scope.label}"
        if not await locks_repo.try_lock(lock_conn, lock_name):
            await runs_repo.finish_run(lock_conn, run_id, "skipped", {}, "another consolidation of this tenant is running")
            return {"runId": run_id, "skipped": "another consolidation is running"}
        try:
            ctx = CycleContext(pool=pool, tenant=scope, settings=rt.settings, llm=rt.llm, budget=rt.llm.budget(),
                               embedder=rt.embedder)
            claimed_id = run_id

            async def stage_progress(state: dict[str, Any]) -> None:
                async with pool.acquire() as conn:
                    await runs_repo.set_progress(conn, claimed_id, state)

            report = await run_cycle(ctx, only=stages, progress=stage_progress)
        except BaseException as exc:
            # Task boundary: the run row records why, then Celery sees the error (and retries
            # connection errors; the redelivered task takes over the same row).
            await runs_repo.finish_run(lock_conn, run_id, "failed", {}, f"{exc.__class__.__name__}: {exc}")
            raise
        finally:
            await locks_repo.unlock(lock_conn, lock_name)
        span = trace.get_current_span().get_span_context()
        # Which request caused this run, for an operator reading the row.
        report["traceId"] = format(span.trace_id, "032x") if span.is_valid else None
        report["correlationId"] = correlation_id.get()
        status = "succeeded" if not report["failedStages"] else "failed"
        error = f"stages failed: {', '.join(report['failedStages'])}" if report["failedStages"] else None
        await runs_repo.finish_run(lock_conn, run_id, status, report, error)
    finally:
        await pool.release(lock_conn)
    await _invalidate_recall_cache(rt)
    report["runId"] = run_id
    logger.info("%s run %s (%s) %s", claimed["job"], run_id, scope.label, status)
    return report
