"""The MCP surface: a low-level `mcp` Server whose tools forward to recall and ingest, plus
the tools, prompts and resources the gateway answers itself."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from prometheus_client import Counter

from services.common.internal import parse_arguments
from services.gateway.core import unavailable
from services.gateway.core.upstream import Upstreams
from services.gateway.core.usage import DailyCalls
from services.gateway.mcp import modes, skill_guide
from services.gateway.sessions.registry import GatewaySession, SessionRegistry
from shared.contract.base import check_storable
from shared.contract.catalog import TOOLS, TOOLS_BY_NAME, ToolSpec
from shared.domain.errors import INVALID_REQUEST, EngramError, PermissionDenied
from shared.domain.principal import Principal
from shared.repositories import topics as topics_repo
from shared.telemetry import CORRELATION_HEADER, correlation_id, extract_context, new_correlation_id

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer("engram.gateway")

PRINCIPAL_SCOPE_KEY = "engram.principal"
SESSION_STATE_KEY = "engram.session"
# JSON-RPC server error for a key past its daily_limit (the seed names no code for it).
DAILY_LIMIT_EXCEEDED = -32000

RBAC_DENIED = Counter("mcp_rbac_denied_total", "Tool calls refused by RBAC", ["tool", "required"])
MODE_DENIED = Counter("mcp_mode_denied_total", "Tool calls refused by the session's mode preset", ["tool", "mode"])
MCP_TOOL_CALLS = Counter("mcp_tool_calls_total", "MCP tool calls", ["tool", "outcome"])


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
    """What the MCP handlers need; the app's lifespan fills in the clients."""

    upstreams: Upstreams
    pool: asyncpg.Pool | None = None
    registry: SessionRegistry | None = None
    daily_calls: DailyCalls | None = None
    # rotate(session, reason) -> the seed's rotate reply; set by the app (it owns the transports).
    rotate: Any = None
    config: dict[str, Any] = field(default_factory=dict)


def _connection(ctx: Any) -> Any:
    # The SDK keeps per-connection state on the runner's Connection; ServerSession wraps it.
    return ctx.session._connection


def _session(ctx: Any) -> GatewaySession | None:
    state = getattr(_connection(ctx), "state", None)
    return state.get(SESSION_STATE_KEY) if state is not None else None


def _principal(ctx: Any) -> Principal:
    request = getattr(ctx, "request", None)
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY) if request is not None else None
    if principal is None:
        # Legacy SSE: POST /message carries no credential; the session holds the one from GET /sse.
        session = _session(ctx)
        if session is not None and session.closed:  # ended (its key was revoked) with a message in flight
            raise MCPError(code=INVALID_REQUEST, message="Session ended")
        principal = session.principal if session is not None else None
    if principal is None:  # every transport authenticates first; this is a wiring bug
        raise MCPError(code=INVALID_REQUEST, message="Internal error")
    return principal


def _mode(ctx: Any, principal: Principal) -> str | None:
    request = getattr(ctx, "request", None)
    header = modes.normalize(request.headers.get(modes.MODE_HEADER)) if request is not None else None
    if header:
        return header
    session = _session(ctx)
    if session is not None and session.mode:
        return session.mode
    return modes.normalize(principal.default_mode)


def tool_listing(spec: ToolSpec) -> types.Tool:
    return types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema(), meta=spec.meta())


def _text_result(result: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
        structured_content=result,
        is_error=is_error,
    )


def build_mcp_server(gw: GatewayContext, version: str) -> Server[Any]:
    async def on_initialize(ctx: Any) -> None:
        """Bind the connection to a gateway session: owner, mode, segment."""
        connection = _connection(ctx)
        transport_id = connection.session_id
        if transport_id is None or gw.registry is None:
            return
        existing = gw.registry.get(transport_id)
        # Legacy SSE: the session was opened (and authenticated) at GET /sse.
        principal = existing.principal if existing is not None else _principal(ctx)
        params = ctx.params or {}
        request = getattr(ctx, "request", None)
        header_mode = modes.normalize(request.headers.get(modes.MODE_HEADER)) if request is not None else None
        mode_given = bool(header_mode or modes.normalize(params.get("mode")))
        mode = header_mode or modes.normalize(params.get("mode")) or modes.normalize(principal.default_mode)
        bound = connection.state.get(SESSION_STATE_KEY)
        if bound is not None:
            # A reused session initialized again: it keeps its state, the new mode applies.
            bound.mode = mode
            return
        if existing is not None:
            if mode_given:
                existing.mode = mode
            session = existing
        else:
            token = None
            if request is not None:
                scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
                token = value.strip() if scheme.lower() == "bearer" else None
            session = await gw.registry.open(transport_id, "streamable-http", principal, token, mode, mode_given=mode_given)
        connection.state[SESSION_STATE_KEY] = session
        registry = gw.registry

        async def closed() -> None:
            await registry.close(transport_id, "session_end")

        connection.exit_stack.push_async_callback(closed)

    async def middleware(ctx: Any, call_next: Any) -> Any:
        try:
            return await handle(ctx, call_next)
        except unavailable.DEPENDENCY_ERRORS as exc:
            # Postgres (sessions, topics, daily counts) or an internal service is down: a
            # JSON-RPC error that says so, not the SDK's code 0 carrying the exception text.
            logger.warning("%s: %s", ctx.method, unavailable.reason(exc), exc_info=True)
            raise unavailable.mcp_error(exc) from None

    async def handle(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "initialize":
            result = await call_next(ctx)
            await on_initialize(ctx)
            return result
        result = await call_next(ctx)
        if ctx.method == "tools/list" and isinstance(result, dict):
            # seed: every tools/list entry carries a top-level `meta`; the SDK's result sieve
            # keeps only `_meta`, so the reference's field is put back after it.
            for tool in result.get("tools", []):
                spec = TOOLS_BY_NAME.get(tool.get("name"))
                if spec is not None:
                    tool["meta"] = spec.meta()
        return result

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        mode = _mode(ctx, _principal(ctx))
        shown = modes.visible(mode, list(TOOLS), lambda s: s.name)
        return types.ListToolsResult(tools=[tool_listing(spec) for spec in shown])

    async def gateway_tool(ctx: Any, spec: ToolSpec, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        args = parse_arguments(spec.args, arguments)
        if spec.name == "get_skill_guide":
            return skill_guide.guide(args.section), False
        if spec.name == "session_rotate":
            session = _session(ctx)
            if session is None or gw.rotate is None:
                return {"ok": False, "error": "no session to rotate"}, True
            presented = gw.registry.client_id(session, _connection(ctx).session_id) if gw.registry else session.session_id
            return await gw.rotate(session, presented, args.reason or "explicit_rotate"), False
        raise MCPError(code=-32602, message=f"Unknown tool: {spec.name}")

    async def enforce_daily_limit(principal: Principal) -> None:
        if principal.key_id is None or principal.daily_limit is None or gw.daily_calls is None:
            return
        calls = await gw.daily_calls.count(principal.key_id)
        if calls > principal.daily_limit:
            raise MCPError(code=DAILY_LIMIT_EXCEEDED, message=f"Daily limit exceeded ({principal.daily_limit} calls per day)")

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        # The handler runs in the session's task, whose context came from whichever request
        # opened it; this call's trace context and correlation id come from its own headers.
        request = getattr(ctx, "request", None)
        headers = {k.lower(): v for k, v in request.headers.items()} if request is not None else {}
        token = correlation_id.set(headers.get(CORRELATION_HEADER) or new_correlation_id())
        try:
            with _tracer.start_as_current_span(
                f"tools/call {params.name}", context=extract_context(headers), kind=trace.SpanKind.SERVER
            ):
                return await _call_tool(ctx, params)
        finally:
            correlation_id.reset(token)

    async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        principal = _principal(ctx)
        spec = TOOLS_BY_NAME.get(params.name)
        if spec is None:
            raise MCPError(code=-32602, message=f"Unknown tool: {params.name}")
        mode = _mode(ctx, principal)
        if not modes.allows(mode, spec.name):
            MODE_DENIED.labels(spec.name, str(mode)).inc()
            raise MCPError(code=INVALID_REQUEST, message=f"Tool '{spec.name}' is not available in mode '{mode}'")
        arguments = dict(params.arguments or {})
        try:
            check_permission(principal, spec.name, spec.permission)
            await enforce_daily_limit(principal)
            session = _session(ctx)
            wire_session = None
            if session is not None and gw.registry is not None:
                segment = await gw.registry.current_segment(session, spec.name)
                wire_session = {"id": segment, "transport_id": session.session_id}
            check_storable(arguments)  # NaN / Infinity cannot cross the internal JSON hop
            if spec.service == "gateway":
                result, is_error = await gateway_tool(ctx, spec, arguments)
            else:
                result, is_error = await gw.upstreams.call(spec.service, spec.name, arguments, principal, wire_session)
        except EngramError as exc:
            MCP_TOOL_CALLS.labels(spec.name, "error").inc()
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None
        MCP_TOOL_CALLS.labels(spec.name, "tool_error" if is_error else "ok").inc()
        return _text_result(result, is_error)

    async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name=name,
                    description=description,
                    arguments=[types.PromptArgument(name=a, description=d, required=r) for a, d, r in arguments],
                )
                for name, (description, arguments) in skill_guide.PROMPTS.items()
            ]
        )

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name not in skill_guide.PROMPTS:
            raise MCPError(code=-32602, message=f"Unknown prompt: {params.name}")
        description, declared = skill_guide.PROMPTS[params.name]
        arguments = dict(params.arguments or {})
        missing = [a for a, _d, required in declared if required and not arguments.get(a)]
        if missing:
            raise MCPError(code=-32602, message=f"Missing required argument(s): {', '.join(missing)}")
        text = skill_guide.prompt_text(params.name, arguments)
        return types.GetPromptResult(
            description=description,
            messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))],
        )

    resources = {
        "memory://stats": ("stats", "Fragment counts by type and tier, from memory_stats"),
        "memory://topics": ("topics", "Every distinct topic label the caller can see"),
        "memory://config": ("config", "Weights, limits and TTL thresholds in effect"),
        "memory://active-session": ("active-session", "This session's tool activity"),
    }

    async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(uri=uri, name=name, description=description, mime_type="application/json")
                for uri, (name, description) in resources.items()
            ]
        )

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        try:
            return await read_resource_body(ctx, str(params.uri))
        except EngramError as exc:
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None

    async def read_resource_body(ctx: Any, uri: str) -> types.ReadResourceResult:
        principal = _principal(ctx)
        if uri == "memory://stats":
            check_permission(principal, "memory_stats", "read")
            body, _ = await gw.upstreams.call("recall", "memory_stats", {}, principal, None)
        elif uri == "memory://topics":
            check_permission(principal, "recall", "read")
            if gw.pool is None:  # the lifespan sets it before the first request
                raise RuntimeError("gateway pool not set up")
            async with gw.pool.acquire() as conn:
                body = {"topics": await topics_repo.list_topics(conn, principal)}
        elif uri == "memory://config":
            body = gw.config
        elif uri == "memory://active-session":
            session = _session(ctx)
            body = (
                {
                    "sessionId": session.session_id,
                    # The id this connection's client uses (a reconnect or a rotate gives it a new one).
                    "transportId": gw.registry.client_id(session, _connection(ctx).session_id) if gw.registry else session.session_id,
                    "segmentId": session.segment_id(gw.registry.segmented if gw.registry else False),
                    "transport": session.transport,
                    "mode": session.mode,
                    "keyId": session.principal.key_id,
                    "startedAt": session.started_at,
                    "activity": list(session.activity),
                }
                if session is not None
                else {"sessionId": None, "activity": []}
            )
        else:
            raise MCPError(code=-32602, message=f"Unknown resource: {uri}")
        text = json.dumps(body, ensure_ascii=False, default=str)
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)])

    server: Server[Any] = Server(
        "engram",
        version=version,
        instructions="Long-term memory: remember atomic fragments, recall them by meaning or keyword.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
    server.middleware.append(middleware)
    return server
