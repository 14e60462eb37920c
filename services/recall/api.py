"""Recall routes: health, and the read tools behind POST /v1/tools/{name}."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.common.internal import ToolContext
from services.recall import service, tools
from shared.db import ping

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    try:
        await ping(request.app.state.resources.pool)
    except Exception as exc:  # top-level health probe: any failure means "not ready"
        return JSONResponse({"status": "degraded", "database": f"error: {exc.__class__.__name__}"}, status_code=503)
    return JSONResponse({"status": "healthy", "service": "recall", "database": "ok"})


def _handler(fn: Any) -> Any:
    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return await fn(request.app.state.resources, ctx, arguments)

    return handle


tool_handlers = {
    "recall": _handler(service.recall),
    "context": _handler(tools.context),
    "search_traces": _handler(tools.search_traces),
    "reconstruct_history": _handler(tools.reconstruct_history),
    "graph_explore": _handler(tools.graph_explore),
    "fragment_history": _handler(tools.fragment_history),
    "memory_stats": _handler(tools.memory_stats),
    "tool_feedback": _handler(tools.tool_feedback),
}
