"""The MCP surface: a low-level `mcp` Server whose tools forward to recall and ingest."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from prometheus_client import Counter
from pydantic import Field

from services.gateway.upstream import Upstreams
from shared.contract.catalog import TOOLS, TOOLS_BY_NAME, ToolSpec
from shared.domain.errors import EngramError, PermissionDenied
from shared.domain.principal import Principal

logger = logging.getLogger(__name__)

PRINCIPAL_SCOPE_KEY = "engram.principal"

RBAC_DENIED = Counter("mcp_rbac_denied_total", "Tool calls refused by RBAC", ["tool", "required"])
MCP_TOOL_CALLS = Counter("mcp_tool_calls_total", "MCP tool calls", ["tool", "outcome"])


class MementoTool(types.Tool):
    """A tools/list entry with the reference's top-level `meta` block (besides MCP's `_meta`)."""

    memento_meta: dict[str, Any] | None = Field(default=None, alias="meta")


def has_permission(principal: Principal, required: str | None) -> bool:
    """seed RBAC: no entry -> no check; master (permissions null) and admin pass everything."""
    if required is None or principal.permissions is None:
        return True
    return "admin" in principal.permissions or required in principal.permissions


def check_permission(principal: Principal, spec_name: str, required: str | None) -> None:
    if has_permission(principal, required):
        return
    reason = f"Permission denied: '{spec_name}' requires '{required}' permission"
    # seed: the reason stays in the server log; the client sees -32600 "Internal error".
    logger.warning("%s (key %s)", reason, principal.key_id)
    RBAC_DENIED.labels(spec_name, str(required)).inc()
    raise PermissionDenied(reason)


@dataclass
class GatewayContext:
    upstreams: Upstreams


def _principal(ctx: Any) -> Principal:
    request = getattr(ctx, "request", None)
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY) if request is not None else None
    if principal is None:  # the auth wrapper runs before every request; this is a wiring bug
        raise MCPError(code=-32600, message="Internal error")
    return principal


def _session(ctx: Any) -> dict[str, Any]:
    request = getattr(ctx, "request", None)
    transport_id = request.headers.get("mcp-session-id") if request is not None else None
    return {"id": transport_id, "transport_id": transport_id}


def tool_listing(spec: ToolSpec) -> MementoTool:
    return MementoTool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.input_schema(),
        meta=spec.meta(),
    )


def build_mcp_server(gw: GatewayContext, version: str) -> Server[Any]:
    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool_listing(spec) for spec in TOOLS])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        principal = _principal(ctx)
        spec = TOOLS_BY_NAME.get(params.name)
        if spec is None:
            raise MCPError(code=-32602, message=f"Unknown tool: {params.name}")
        try:
            check_permission(principal, spec.name, spec.permission)
            result, is_error = await gw.upstreams.call(
                spec.service, spec.name, dict(params.arguments or {}), principal, _session(ctx)
            )
        except EngramError as exc:
            MCP_TOOL_CALLS.labels(spec.name, "error").inc()
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None
        MCP_TOOL_CALLS.labels(spec.name, "tool_error" if is_error else "ok").inc()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
            is_error=is_error,
        )

    return Server(
        "engram",
        version=version,
        instructions="Long-term memory: remember atomic fragments, recall them by meaning or keyword.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
