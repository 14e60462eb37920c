"""Admin REST: the dashboard's figures (seed: GET /stats: fragments, API calls, system metrics,
searchMetrics, observability, queues, healthFlags; master key only).

What lives in the store (fragments, backlogs, search latencies, observability, the database's
size) is recall's view; keys, calls and sessions are read from this gateway's pool like its
other admin routes; system metrics are this gateway host's (psutil); queue depths are read
from Redis where the jobs wait.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from typing import Any

import psutil
from fastapi import APIRouter, Depends, Request
from redis.exceptions import RedisError

from services.gateway.admin.admin_auth import require_master
from services.gateway.admin.upstream import view
from services.gateway.core.state import gateway_state
from shared.jobs import QUEUE_BATCH, QUEUE_MAINTENANCE
from shared.repositories import admin_views as views
from shared.repositories.batch_jobs import DEFAULT_PREFIX as BATCH_PREFIX
from shared.repositories.maintenance import MAX_REFLECT_ATTEMPTS

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

STARTED = time.monotonic()
VERSION = "0.1.0"
# Redis lists the work waits in: Celery's queues, the async batch_remember queue and its dead
# letters, recall's deferred side effects (services/recall/effects.py).
REDIS_QUEUES = {
    "maintenance": QUEUE_MAINTENANCE,
    "batch": QUEUE_BATCH,
    "batchRemember": f"{BATCH_PREFIX}:queue",
    "batchDead": f"{BATCH_PREFIX}:dead",
    "recallEffects": "engram:recall:effects",
}
# healthFlags thresholds. seed: high_l1_miss_rate above 0.5, db_pool_pressure when callers wait.
# Engram's own: an embedding backlog the 10-minute backfill (2,000 a run) cannot clear in
# an hour, and any job in the batch queue's dead letters.
L1_MISS_RATE_FLAG = 0.5
L1_MIN_SEARCHES = 20
EMBEDDING_BACKLOG_FLAG = 12_000
REDIS_PING_SECONDS = 0.5


def system_metrics(db_size_bytes: int | None) -> dict[str, Any]:
    """seed: cpu (1-minute load per core, %), memory and disk (/) used %, the database's size."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else psutil.cpu_percent() / 100 * cores
    return {
        "cpu": min(100, round(load / cores * 100)),
        "memory": round(psutil.virtual_memory().percent),
        "disk": round(psutil.disk_usage("/").percent),
        "dbSizeBytes": db_size_bytes,
    }


async def _redis(request: Request) -> tuple[str, dict[str, int | None]]:
    redis = gateway_state(request).redis
    if redis is None:
        return "disabled", dict.fromkeys(REDIS_QUEUES)
    try:
        async with asyncio.timeout(REDIS_PING_SECONDS):
            await redis.ping()
            depths = [int(await redis.llen(key)) for key in REDIS_QUEUES.values()]
    except (RedisError, OSError, TimeoutError):
        return "disconnected", dict.fromkeys(REDIS_QUEUES)
    return "connected", dict(zip(REDIS_QUEUES, depths, strict=True))


def _pool_waiting(request: Request) -> bool:
    pool = gateway_state(request).pool
    return pool.get_size() >= pool.get_max_size() and pool.get_idle_size() == 0


@router.get("/stats")
async def dashboard_stats(request: Request) -> dict[str, Any]:
    state = gateway_state(request)
    await state.daily_calls.flush()  # calls counted in Redis but not yet in Postgres
    store_view, (redis_status, depths) = await asyncio.gather(view(request, "admin_stats"), _redis(request))
    async with state.pool.acquire() as conn:
        counts = await views.gateway_counts(conn)
        unreflected = await views.unreflected_count(conn, MAX_REFLECT_ATTEMPTS)
    services = state.upstreams.service_status(await state.upstreams.health())
    store = store_view["store"]
    observability = store_view["observability"]
    flags = []
    if redis_status == "disconnected":
        flags.append("redis_disconnected")
    miss = observability.get("l1_miss_rate")
    if miss is not None and miss > L1_MISS_RATE_FLAG and observability["total_searches"] >= L1_MIN_SEARCHES:
        flags.append("high_l1_miss_rate")
    if _pool_waiting(request):
        flags.append("db_pool_pressure")
    if store["embedding_backlog"] > EMBEDDING_BACKLOG_FLAG:
        flags.append("embedding_backlog")
    if depths.get("batchDead"):
        flags.append("batch_dead_letters")
    if counts["last_consolidation_status"] == "failed":
        flags.append("consolidation_failed")
    flags.extend(f"{name}_{status}" for name, status in services.items() if status != "ok")
    return {
        "fragments": store["fragments"],
        "sessions": counts["open_sessions"],
        "apiCallsToday": counts["calls_today"],
        "activeKeys": counts["active_keys"],
        "uptime": int(time.monotonic() - STARTED),
        "version": VERSION,
        "pythonVersion": platform.python_version(),
        "system": system_metrics(store["db_size_bytes"]),
        "db": "connected",
        "redis": redis_status,
        "services": services,
        "searchMetrics": store_view["searchMetrics"],
        "observability": observability,
        "queues": {
            "embeddingBacklog": store["embedding_backlog"],
            "qualityPending": store["quality_pending"],
            "linkBacklog": store["link_backlog"],
            "fsckOpenIssues": store["fsck_open_issues"],
            "unreflectedSessions": unreflected,
            "jobOutbox": counts["job_outbox"],
            **depths,
        },
        "healthFlags": flags,
    }
