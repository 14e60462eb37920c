"""The MCP surface: a low-level `mcp` Server whose tools forward to recall and ingest, plus
the tools, prompts and resources the gateway answers itself."""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any

import asyncpg
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from opentelemetry import context as otel_context
from prometheus_client import Counter

from services.common.internal import CORRELATION_SCOPE_KEY, TRACE_SCOPE_KEY, parse_arguments
from services.common.rpc import InternalClient
from services.gateway.core import unavailable
from services.gateway.core.caller import has_permission
from services.gateway.core.scope import CALL_AHEAD_SCOPE_KEY, OPENED_SCOPE_KEY, PRINCIPAL_SCOPE_KEY, SESSION_SCOPE_KEY, TOKEN_SCOPE_KEY
from services.gateway.core.usage import DailyCalls
from services.gateway.mcp import modes, skill_guide
from services.gateway.mcp.rotation import rotate
from services.gateway.sessions import ActiveSession, CallAhead, SessionGone, Sessions
from shared.contract.base import check_storable
from shared.contract.catalog import TOOLS, TOOLS_BY_NAME, ToolSpec
from shared.domain.errors import INVALID_REQUEST, EngramError, PermissionDenied
from shared.domain.principal import Principal
from shared.metrics import OTHER, count_error, tool_timers
from shared.repositories import topics as topics_repo
from shared.telemetry import correlation_id, new_correlation_id

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]
# JSON-RPC server error for a key past its daily_limit (the seed names no code for it).
DAILY_LIMIT_EXCEEDED = -32000

RBAC_DENIED = Counter("mcp_rbac_denied_total", "Tool calls refused by RBAC", ["tool", "required"])
MODE_DENIED = Counter("mcp_mode_denied_total", "Tool calls refused by the session's mode preset", ["tool", "mode"])
MCP_TOOL_CALLS = Counter("mcp_tool_calls_total", "MCP tool calls", ["tool", "outcome"])
_TOOL_SECONDS = tool_timers("gateway")


def check_permission(principal: Principal, spec_name: str, required: str | None) -> None:
    if has_permission(principal, required):
        return
    reason = f"Permission denied: '{spec_name}' requires '{required}' permission"
    # seed: the reason stays in the server log; the client sees -32600 "Internal error".
    logger.warning("%s (key %s)", reason, principal.key_id)
    RBAC_DENIED.labels(spec_name, str(required)).inc()
    raise PermissionDenied(reason)


def tool_listing(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name, description=spec.description, input_schema=spec.input_schema(),
        annotations=spec.annotations(), meta=spec.meta(),
    )


@functools.cache
def listed_tool(name: str) -> types.Tool:
    """A tool's tools/list entry, built once per process: the catalog is fixed at import, and
    pydantic's JSON schema generation made every tools/list cost ~19 ms of gateway CPU (18
    tools). The SDK only reads it to serialise the reply."""
    return tool_listing(TOOLS_BY_NAME[name])


def _text_result(result: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
        structured_content=result,
        is_error=is_error,
    )


def _daily_limit_exceeded(limit: int) -> MCPError:
    return MCPError(code=DAILY_LIMIT_EXCEEDED, message=f"Daily limit exceeded ({limit} calls per day)")


RESOURCES = {
    "memory://stats": ("stats", "Fragment counts by type and tier, from memory_stats"),
    "memory://topics": ("topics", "Every distinct topic label the caller can see"),
    "memory://config": ("config", "Weights, limits and TTL thresholds in effect"),
    "memory://active-session": ("active-session", "This session's tool activity"),
}


def _scope(ctx: Ctx) -> dict[str, Any]:
    """The ASGI scope of the HTTP request this message came in (the front door filled it)."""
    request = ctx.request
    return request.scope if request is not None else {}


def _session(ctx: Ctx) -> ActiveSession | None:
    scope = _scope(ctx)
    session: ActiveSession | None = scope.get(SESSION_SCOPE_KEY) or scope.get(OPENED_SCOPE_KEY)
    return session


def _principal(ctx: Ctx) -> Principal:
    principal: Principal | None = _scope(ctx).get(PRINCIPAL_SCOPE_KEY)
    if principal is None:  # every transport authenticates first; this is a wiring bug
        raise MCPError(code=INVALID_REQUEST, message="Internal error")
    return principal


def _header_mode(ctx: Ctx) -> str | None:
    request = ctx.request
    return modes.normalize(request.headers.get(modes.MODE_HEADER)) if request is not None else None


def _mode(ctx: Ctx, principal: Principal) -> str | None:
    header = _header_mode(ctx)
    if header:
        return header
    session = _session(ctx)
    if session is not None and session.mode:
        return session.mode
    return modes.normalize(principal.default_mode)


class McpHandler:
    """The tools, prompts and resources of the MCP surface, over the gateway's core: tools
    forward to recall / ingest, or the gateway answers them itself."""

    def __init__(
        self, sessions: Sessions, upstreams: InternalClient, daily_calls: DailyCalls, pool: asyncpg.Pool,
        config: dict[str, Any],
    ) -> None:
        self.sessions = sessions
        self.upstreams = upstreams
        self.daily_calls = daily_calls
        self.pool = pool
        self.config = config

    def server(self, version: str) -> Server[Any]:
        server: Server[Any] = Server(
            "engram",
            version=version,
            instructions="Long-term memory: remember atomic fragments, recall them by meaning or keyword.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
            on_list_resources=self.list_resources,
            on_read_resource=self.read_resource,
        )
        # First, before the SDK's OpenTelemetry middleware: its span (`tools/call <name>`)
        # then nests under this request's HTTP span instead of the session task's context.
        server.middleware.insert(0, self.request_context)
        server.middleware.append(self.middleware)
        return server

    # -- around every message ------------------------------------------------------------
    async def request_context(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        """The SDK dispatches messages in its session's task: the trace context and the
        correlation id of the HTTP request that carried this one come from its scope."""
        scope = _scope(ctx)
        parent = scope.get(TRACE_SCOPE_KEY)
        token = otel_context.attach(parent) if parent is not None else None
        cid = correlation_id.set(scope.get(CORRELATION_SCOPE_KEY) or new_correlation_id())
        try:
            return await call_next(ctx)
        finally:
            correlation_id.reset(cid)
            if token is not None:
                otel_context.detach(token)

    async def middleware(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        try:
            return await self._handle(ctx, call_next)
        except unavailable.DEPENDENCY_ERRORS as exc:
            # Postgres (sessions, topics, daily counts) or an internal service is down: a
            # JSON-RPC error that says so, not the SDK's code 0 carrying the exception text.
            logger.warning("%s: %s", ctx.method, unavailable.reason(exc), exc_info=True)
            raise unavailable.mcp_error(exc) from None
        except SessionGone:  # ended (its key was revoked) with a message in flight
            raise MCPError(code=INVALID_REQUEST, message="Session ended") from None

    async def _handle(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        if ctx.method == "initialize":
            result = await call_next(ctx)
            await self.on_initialize(ctx)
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

    async def on_initialize(self, ctx: Ctx) -> None:
        """Open the session this initialize starts (Streamable HTTP; legacy SSE opened its
        own at GET /sse), or apply the mode of a session initialized again."""
        principal = _principal(ctx)
        params = ctx.params or {}
        header_mode = _header_mode(ctx)
        mode_given = bool(header_mode or modes.normalize(params.get("mode")))
        mode = header_mode or modes.normalize(params.get("mode")) or modes.normalize(principal.default_mode)
        scope = _scope(ctx)
        existing: ActiveSession | None = scope.get(SESSION_SCOPE_KEY)
        if existing is not None:
            if mode_given or existing.transport == "streamable-http":
                await self.sessions.set_mode(existing, mode if mode_given else existing.mode or mode)
            return
        if ctx.request is None:
            return
        token: str | None = scope.get(TOKEN_SCOPE_KEY)
        scope[OPENED_SCOPE_KEY] = await self.sessions.open("streamable-http", principal, token, mode, mode_given=mode_given)

    # -- tools ---------------------------------------------------------------------------
    async def list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        mode = _mode(ctx, _principal(ctx))
        shown = modes.visible(mode, list(TOOLS), lambda s: s.name)
        return types.ListToolsResult(tools=[listed_tool(spec.name) for spec in shown])

    async def call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        started = time.perf_counter()
        try:
            return await self._call_tool(ctx, params)
        finally:
            _TOOL_SECONDS.get(params.name, _TOOL_SECONDS[OTHER]).observe(time.perf_counter() - started)

    async def _call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
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
            wire_session = await self._record_call(principal, _session(ctx), spec.name, _scope(ctx).get(CALL_AHEAD_SCOPE_KEY))
            check_storable(arguments)  # NaN / Infinity cannot cross the internal JSON hop
            if spec.service == "gateway":
                result, is_error = await self._gateway_tool(ctx, spec, arguments)
            else:
                result, is_error = await self.upstreams.call(spec.service, spec.name, arguments, principal, wire_session)
        except EngramError as exc:
            MCP_TOOL_CALLS.labels(spec.name, "error").inc()
            count_error("gateway", spec.name, exc)
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None
        MCP_TOOL_CALLS.labels(spec.name, "tool_error" if is_error else "ok").inc()
        return _text_result(result, is_error)

    async def _gateway_tool(self, ctx: Ctx, spec: ToolSpec, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        args = parse_arguments(spec.args, arguments)
        if spec.name == "get_skill_guide":
            return skill_guide.guide(args.section), False
        if spec.name == "session_rotate":
            session = _session(ctx)
            if session is None:
                return {"ok": False, "error": "no session to rotate"}, True
            return await rotate(self.sessions, session, session.current_client_id, args.reason or "explicit_rotate"), False
        raise MCPError(code=-32602, message=f"Unknown tool: {spec.name}")

    async def _record_call(
        self, principal: Principal, session: ActiveSession | None, tool: str, ahead: CallAhead | None
    ) -> dict[str, Any] | None:
        """Count the call against the key's daily_limit and record it in its session (the
        wire session it is forwarded with): where both live in Redis, in one round trip, which
        is usually the front door's (`ahead`: recorded there, taken here as the checks passed)."""
        key_id, limit = principal.key_id, principal.daily_limit
        gate = self.daily_calls.gate(key_id, limit) if key_id is not None and limit is not None and session else None
        # Without a session or without Redis the call is counted on its own, first.
        if gate is None and key_id is not None and limit is not None and await self.daily_calls.count(key_id) > limit:
            raise _daily_limit_exceeded(limit)
        if session is None:
            return None
        segment, counted = await self.sessions.current_segment(session, tool, gate, ahead)
        if gate is not None and key_id is not None:
            calls = await self.daily_calls.counted(key_id, counted)
            if segment is None or calls > gate.limit:  # segment None: the gate refused it
                raise _daily_limit_exceeded(gate.limit)
        return {"id": segment, "transport_id": session.session_id}

    # -- prompts -------------------------------------------------------------------------
    async def list_prompts(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
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

    async def get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
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

    # -- resources -----------------------------------------------------------------------
    async def list_resources(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(uri=uri, name=name, description=description, mime_type="application/json")
                for uri, (name, description) in RESOURCES.items()
            ]
        )

    async def read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        try:
            return await self._read_resource(ctx, str(params.uri))
        except EngramError as exc:
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None

    async def _read_resource(self, ctx: Ctx, uri: str) -> types.ReadResourceResult:
        principal = _principal(ctx)
        body: dict[str, Any]
        if uri == "memory://stats":
            check_permission(principal, "memory_stats", "read")
            body, _ = await self.upstreams.call("recall", "memory_stats", {}, principal, None)
        elif uri == "memory://topics":
            check_permission(principal, "recall", "read")
            async with self.pool.acquire() as conn:
                body = {"topics": await topics_repo.list_topics(conn, principal)}
        elif uri == "memory://config":
            body = self.config
        elif uri == "memory://active-session":
            body = await self._active_session(ctx)
        else:
            raise MCPError(code=-32602, message=f"Unknown resource: {uri}")
        text = json.dumps(body, ensure_ascii=False, default=str)
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)])

    async def _active_session(self, ctx: Ctx) -> dict[str, Any]:
        seen = _session(ctx)
        # The store's latest (another replica may have served the last call).
        session = await self.sessions.resolve(seen.client_id, touch=False) if seen is not None else None
        if session is None:
            return {"sessionId": None, "activity": []}
        return {
            "sessionId": session.session_id,
            # The id this connection's client uses (a reconnect or a rotate gives it a new one).
            "transportId": session.current_client_id,
            "segmentId": session.segment_id(self.sessions.segmented),
            "transport": session.transport,
            "mode": session.mode,
            "keyId": session.key_id,
            "startedAt": session.doc["started_at"],
            "activity": await self.sessions.activity(session),
        }
