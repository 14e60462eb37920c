"""Recall routes: health, and the read tools behind POST /v1/tools/{name}."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.common.internal import ToolContext, parse_arguments
from services.recall import service
from shared.contract.read import MemoryStatsArgs
from shared.db import ping
from shared.repositories import fragments as fragments_repo

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    try:
        await ping(request.app.state.resources.pool)
    except Exception as exc:  # top-level health probe: any failure means "not ready"
        return JSONResponse({"status": "degraded", "database": f"error: {exc.__class__.__name__}"}, status_code=503)
    return JSONResponse({"status": "healthy", "service": "recall", "database": "ok"})


async def _recall(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    return await service.recall(request.app.state.resources, ctx, arguments)


async def _memory_stats(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    parse_arguments(MemoryStatsArgs, arguments)
    async with request.app.state.resources.pool.acquire() as conn:
        stats = await fragments_repo.stats(conn, ctx.principal)
    return {"success": True, "stats": stats}, False


tool_handlers = {"recall": _recall, "memory_stats": _memory_stats}
