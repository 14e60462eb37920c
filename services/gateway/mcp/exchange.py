"""One JSON-RPC request of a session, POSTed to /mcp, answered with one JSON body: the
gateway's hot path (every tool call), served without the SDK's per-request transport.

In stateless mode the SDK serves each POST through a fresh StreamableHTTPServerTransport:
four memory streams, a task group with a message router, a dispatcher loop and a task for
the handler, torn down again after the one reply (13% of the gateway's CPU per tool call in
a py-spy profile, bench/README.md). A request that carries no stream has no use for them.
mcp 2.3.0's public `serve_one` runs one request through the server's whole handler chain
(its middleware, OpenTelemetry included, params validation, the result sieve), which is
what the transport's dispatcher does for it; the checks and the answer around it are the
transport's, as mcp 2.3.0 writes them for a JSON-response POST. Anything else (initialize,
notifications, a sessionless request, another protocol era) still goes to the SDK.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import DEFAULT_NEGOTIATED_VERSION, INVALID_REQUEST, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

JSON = "application/json"
# The transport context of a JSON-response POST: its reply has no room for a request to the client.
_TRANSPORT = TransportContext(kind="streamable-http", can_send_request=False)


@dataclass
class _OneRequest:
    """The SDK's DispatchContext protocol for one request whose answer is one JSON body:
    nothing can reach the client before it (mcp 2.3.0 drops a JSON-response request's
    notifications too), and a request to the client has nowhere to go."""

    request_id: RequestId
    message_metadata: ServerMessageMetadata
    transport: TransportContext = _TRANSPORT
    can_send_request: bool = False
    cancel_requested: anyio.Event = field(default_factory=anyio.Event)

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        return None

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


class JsonExchange:
    """Serves a POSTed JSON-RPC request within a session, as mcp 2.3.0's stateless
    JSON-response transport answers it: the same Host / Origin / Content-Type and Accept
    checks and statuses, the same reply body, the same error for a failing handler."""

    def __init__(self, server: Server[Any], security: TransportSecurityMiddleware) -> None:
        self.server = server
        self.security = security
        self._lifespan_state: Any = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The server's lifespan state for the requests served here (mcp 2.3.0's session
        manager keeps its own copy private; Engram's server has the SDK's default lifespan,
        an empty dict, so entering it once more costs nothing)."""
        async with self.server.lifespan(self.server) as state:
            self._lifespan_state = state
            try:
                yield
            finally:
                self._lifespan_state = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send, message: JSONRPCRequest) -> None:
        request = Request(scope, receive)
        refused = await self.security.validate_request(request, is_post=True)
        if refused is not None:
            await refused(scope, receive, send)
            return
        has_json, _ = check_accept_headers(request)
        if not has_json:
            await _error("Not Acceptable: Client must accept application/json", 406)(scope, receive, send)
            return
        version = Headers(scope=scope).get("mcp-protocol-version") or DEFAULT_NEGOTIATED_VERSION
        # Born ready, no channel to the client: what the stateless transport builds per request.
        connection = Connection.from_envelope(version, None, None)
        context = _OneRequest(message.id, ServerMessageMetadata(request_context=request, can_send_request=False))
        reply: JSONRPCResponse | JSONRPCError
        try:
            result = await serve_one(
                self.server, context, message.method, message.params, connection=connection, lifespan_state=self._lifespan_state
            )
        except Exception as exc:  # the dispatcher's boundary: every handler failure is a JSON-RPC error
            error = handler_exception_to_error_data(exc)
            if error is None:
                # mcp 2.3.0's dispatcher answers code 0 with the exception's text; the same here.
                logger.exception("handler for %r raised", message.method)
                error = ErrorData(code=0, message=str(exc))
            reply = JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
        else:
            reply = JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
        body = reply.model_dump_json(by_alias=True, exclude_unset=True)
        await Response(body, status_code=200, headers={"Content-Type": JSON})(scope, receive, send)


def _error(message: str, status: int) -> Response:
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message))
    return Response(body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status, headers={"Content-Type": JSON})
