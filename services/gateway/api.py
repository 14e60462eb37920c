"""Gateway HTTP routes besides MCP: health (readiness) and liveness."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from services.gateway.core.state import GatewayState, gateway_state
from shared.db import ping

logger = logging.getLogger(__name__)
router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """seed: Postgres is required (down -> 503); Redis is optional (down -> 200 + warning,
    REDIS_ENABLED=false -> `disabled`). Recall and ingest are required the way Postgres is: with
    no replica of one answering, no memory tool can be served, so 503 `degraded` (a readiness
    probe takes this gateway out of rotation); some replicas down -> 200 + warning (calls go to
    the others). Liveness is /health/live: a dependency that is down is not cured by
    restarting the gateway (deploy/k8s/base/gateway.yaml)."""
    state = gateway_state(request)
    warnings: list[str] = []
    checks: dict[str, Any] = {}
    # Concurrently, each with its own short timeout: the answer stays inside a probe's 3 s.
    database, redis_check, replicas = await asyncio.gather(_database(state), _redis(state), state.upstreams.health())
    checks["database"] = database
    healthy = database["status"] == "ok"
    checks["redis"] = redis_check
    if redis_check["status"] == "warning":
        warnings.append("Redis unreachable: L1 cache and working memory disabled; core memory works from PostgreSQL")
    try:
        active = await state.sessions.store.count_used()
    except RedisError:  # reported under checks.redis
        active = 0
    held_sse = len(state.sessions.held_sse)
    # Every replica's sessions (the store is shared); legacy SSE: the streams this one holds.
    checks["sessions"] = {"status": "ok", "active": active, "streamableHttp": max(0, active - held_sse), "sse": held_sse}
    checks["services"] = replicas
    for url, info in replicas.items():
        if info["status"] != "ok":
            warnings.append(f"{info['service']} at {url} is {info['status']}")
    services = state.upstreams.service_status(replicas)
    if "down" in services.values():
        healthy = False
    body = {
        "status": "healthy" if healthy else "degraded",
        "timestamp": datetime.now(UTC).isoformat(),
        "services": services,
        "checks": checks,
        "warnings": warnings,
    }
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get("/health/live")
async def live() -> JSONResponse:
    """Liveness: the process serves requests. Nothing downstream is asked."""
    return JSONResponse({"status": "alive"})


async def _database(state: GatewayState) -> dict[str, Any]:
    try:
        await ping(state.pool)
    except Exception as exc:  # any failure of the probe means the database is unusable  # noqa: BLE001
        return {"status": "down", "error": exc.__class__.__name__}
    return {"status": "ok"}


async def _redis(state: GatewayState) -> dict[str, Any]:
    if state.redis is None:
        return {"status": "disabled"}
    try:
        await state.redis.ping()
    except Exception as exc:  # redis-py raises many error types; all mean "unreachable"  # noqa: BLE001
        return {"status": "warning", "error": exc.__class__.__name__}
    return {"status": "ok"}
