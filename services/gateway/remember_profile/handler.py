"""The remember profile's MCP server: its tools forward to ingest (remember -> the internal
`profile_remember`) and recall (the read tools -> `recall` / `context`), with the caller the
gateway's front door resolved. A refusal the model can act on is a tool result with
isError and {"error": kind, "message"}; kinds: forbidden (the key lacks memory:write /
read), validation_failure, authorization_failure, safety_rejection."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from services.gateway.core import unavailable
from services.gateway.core.caller import has_permission
from services.gateway.core.scope import PRINCIPAL_SCOPE_KEY
from services.gateway.core.state import GatewayState
from services.gateway.remember_profile import tools
from shared.domain import logical_path
from shared.domain.errors import INVALID_PARAMS, INVALID_REQUEST, EngramError
from shared.domain.principal import Principal

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]
DEVICE_HEADER = "x-device-label"
DEVICE_UNLABELED = "unlabeled"
MAX_DEVICE_LABEL = 64
_DEVICE_UNSAFE = re.compile(r"[^\w .:@()-]")
# JSON-RPC server error for a key past its daily_limit (as on /mcp).
DAILY_LIMIT_EXCEEDED = -32000
MASTER = "master"


def _result(body: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
        structured_content=body, is_error=is_error,
    )


def _refusal(kind: str, message: str) -> types.CallToolResult:
    return _result({"error": kind, "message": message}, is_error=True)


def device_label(ctx: Ctx) -> str:
    """The caller's device label (X-Device-Label), cleaned; "unlabeled" without one."""
    request = ctx.request
    raw = request.headers.get(DEVICE_HEADER, "") if request is not None else ""
    label = _DEVICE_UNSAFE.sub("_", raw.strip())[:MAX_DEVICE_LABEL].strip()
    return label or DEVICE_UNLABELED


def _principal(ctx: Ctx) -> Principal:
    request = ctx.request
    principal: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY) if request is not None else None
    if principal is None:  # the endpoint answers 401 before the SDK runs; a wiring bug
        raise MCPError(code=INVALID_REQUEST, message="Internal error")
    return principal


class RememberProfileHandler:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def server(self, version: str) -> Server[Any]:
        server: Server[Any] = Server(
            "engram-remember-profile", version=version,
            instructions=(
                "Durable memory with a logical path: remember(content, path, create_project) stores under a project "
                "(projects/<name>/...) or a namespace; confirm a write with search_memory(query, path)."),
            on_list_tools=self.list_tools, on_call_tool=self.call_tool,
        )
        server.middleware.append(self.middleware)
        return server

    async def middleware(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except unavailable.DEPENDENCY_ERRORS as exc:
            logger.warning("%s: %s", ctx.method, unavailable.reason(exc), exc_info=True)
            raise unavailable.mcp_error(exc) from None

    async def list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools.listing())

    async def call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        principal = _principal(ctx)
        spec = tools.TOOLS.get(params.name)
        if spec is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        model, _description, permission, _read_only = spec
        if not has_permission(principal, permission):
            scope = "memory:write" if permission == "write" else "memory:read"
            return _refusal("forbidden", f"{params.name} requires {scope}; this key has {list(principal.permissions or [])}")
        arguments = dict(params.arguments or {})
        try:
            args = tools.parse(model, arguments)
        except tools.ArgumentRefused as exc:
            if exc.kind == "validation_failure":
                raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
            return _refusal(exc.kind, str(exc))
        await self._enforce_daily_limit(principal)
        try:
            if params.name == "remember":
                return await self._remember(ctx, principal, args)
            if params.name == "recall_context":
                return await self._context(principal, args)
            return await self._search(principal, args, params.name)
        except logical_path.PathRefused as exc:
            kind = {"safety": "safety_rejection", "authorization": "authorization_failure"}.get(exc.kind, "validation_failure")
            return _refusal(kind, str(exc))
        except EngramError as exc:
            raise MCPError(code=exc.code, message=exc.message, data=exc.data) from None

    async def _remember(self, ctx: Ctx, principal: Principal, args: tools.RememberArgs) -> types.CallToolResult:
        arguments = {**args.model_dump(), "device_label": device_label(ctx)}
        result, is_error = await self.state.upstreams.call("ingest", "profile_remember", arguments, principal, None)
        if is_error:
            return _refusal(str(result.get("error", "validation_failure")), str(result.get("message", "not stored")))
        return _result(result)

    async def _search(self, principal: Principal, args: tools.SearchArgs | tools.RecallArgs, tool: str) -> types.CallToolResult:
        target = logical_path.parse(args.path) if args.path else None
        upstream: dict[str, Any] = {"pageSize": args.limit, "includeLinks": False, "tokenBudget": 4000}
        query = args.query
        if query:
            upstream["text"] = query
        if target is not None:
            upstream["workspace"] = target.workspace if target.workspace is not None else principal.default_workspace
            whole_project = target.project is not None and target.path.count("/") == 1
            if not whole_project:
                upstream["topic"] = target.topic
        if "text" not in upstream and "topic" not in upstream:
            if target is None:
                raise MCPError(code=INVALID_PARAMS, message=f"Invalid params: {tool} needs query or path")
            # A whole project without a query: its memories by meaning of the project's name.
            upstream["text"] = target.project or target.path
        result, is_error = await self.state.upstreams.call("recall", "recall", upstream, principal, None)
        if is_error:
            return _refusal("validation_failure", str(result.get("error") or result.get("message") or "search failed"))
        memories = [self._memory(f, principal) for f in result.get("fragments", [])]
        if target is not None:
            # The workspace filter also admits global memories; a scope is the path's own.
            memories = [m for m in memories if _under(m["path"], target.path)]
        return _result({"memories": memories[: args.limit], "count": len(memories[: args.limit])})

    async def _context(self, principal: Principal, args: tools.RecallContextArgs) -> types.CallToolResult:
        target = logical_path.parse(args.path) if args.path else None
        upstream: dict[str, Any] = {
            "tokenBudget": args.token_budget,
            "types": ["fact", "decision", "preference", "procedure", "error", "episode"],
        }
        if target is not None:
            upstream["workspace"] = target.workspace if target.workspace is not None else principal.default_workspace
        result, is_error = await self.state.upstreams.call("recall", "context", upstream, principal, None)
        if is_error:
            return _refusal("validation_failure", str(result.get("error") or "context failed"))
        memories = [self._memory(f, principal) for f in result.get("fragments", [])]
        if target is not None:
            memories = [m for m in memories if _under(m["path"], target.path)]
        return _result({"path": target.path if target else None, "memories": memories, "count": len(memories)})

    @staticmethod
    def _memory(fragment: dict[str, Any], principal: Principal) -> dict[str, Any]:
        return {
            "reference": fragment["id"],
            "path": logical_path.path_of(fragment.get("workspace"), fragment.get("topic", ""), principal.default_workspace),
            "content": fragment.get("content"),
            "kind": fragment.get("type"),
            "created_at": fragment.get("created_at"),
        }

    async def _enforce_daily_limit(self, principal: Principal) -> None:
        if principal.key_id is None or principal.daily_limit is None:
            return
        calls = await self.state.daily_calls.count(principal.key_id)
        if calls > principal.daily_limit:
            raise MCPError(code=DAILY_LIMIT_EXCEEDED, message=f"Daily limit exceeded ({principal.daily_limit} calls per day)")


def _under(path: str, scope: str) -> bool:
    return path == scope or path.startswith(scope.rstrip("/") + "/")
