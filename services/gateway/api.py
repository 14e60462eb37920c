"""Gateway HTTP routes besides MCP: health."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from shared.db import ping

logger = logging.getLogger(__name__)
router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """seed: Postgres is required (down -> 503); Redis is optional (down -> 200 + warning,
    REDIS_ENABLED=false -> `disabled`)."""
    state = request.app.state
    warnings: list[str] = []
    checks: dict[str, Any] = {}
    healthy = True
    try:
        await ping(state.pool)
        checks["database"] = {"status": "ok"}
    except Exception as exc:  # any failure of the probe means the database is unusable
        healthy = False
        checks["database"] = {"status": "down", "error": exc.__class__.__name__}
    if state.redis is None:
        checks["redis"] = {"status": "disabled"}
    else:
        try:
            await state.redis.ping()
            checks["redis"] = {"status": "ok"}
        except Exception as exc:  # redis-py raises many error types; all mean "unreachable"
            checks["redis"] = {"status": "warning", "error": exc.__class__.__name__}
            warnings.append("Redis unreachable: L1 cache and working memory disabled; core memory works from PostgreSQL")
    registry = getattr(state, "registry", None)
    if registry is not None:
        open_sessions = [s.transport for s in registry.sessions()]
        checks["sessions"] = {
            "status": "ok",
            "active": len(open_sessions),
            "streamableHttp": open_sessions.count("streamable-http"),
            "sse": open_sessions.count("sse"),
        }
    else:
        checks["sessions"] = {"status": "ok"}
    services = await state.upstreams.health()
    checks["services"] = services
    for url, info in services.items():
        if info["status"] != "ok":
            warnings.append(f"{info['service']} at {url} is {info['status']}")
    body = {
        "status": "healthy" if healthy else "degraded",
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "checks": checks,
        "warnings": warnings,
    }
    return JSONResponse(body, status_code=200 if healthy else 503)
