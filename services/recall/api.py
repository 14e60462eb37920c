"""Recall routes: health, and the read tools behind POST /v1/tools/{name}."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from services.common.handlers import joined
from services.common.internal import ToolContext, database_health
from services.recall import service, tools
from services.recall.admin_views import TOOL_HANDLERS as ADMIN_VIEW_HANDLERS
from services.recall.artifacts import TOOL_HANDLERS as ARTIFACT_TOOL_HANDLERS
from services.recall.memory_api import TOOL_HANDLERS as MEMORY_TOOL_HANDLERS
from services.recall.mnemory_api import TOOL_HANDLERS as MNEMORY_TOOL_HANDLERS

router = APIRouter()
router.add_api_route("/health", database_health("recall"), methods=["GET"])


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
tool_handlers = joined(
    tool_handlers,
    # The memory REST API's reads (reference 001; services/gateway/memory_api/).
    MEMORY_TOOL_HANDLERS,
    # The mnemory REST surface's reads (reference 004; services/gateway/mnemory_api/).
    MNEMORY_TOOL_HANDLERS,
    # The admin console's views (gateway admin routes, master key only; not MCP tools).
    ADMIN_VIEW_HANDLERS,
    # Served for the gateway's /api/memories/{id}/artifacts routes (reference 004).
    ARTIFACT_TOOL_HANDLERS,
)
