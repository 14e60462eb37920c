"""The MCP transports: Streamable HTTP (/mcp) and legacy SSE (GET /sse + POST /message),
both served by the SDK around one low-level Server."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_loop
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from services.gateway.core.edge import TOKEN_SCOPE_KEY
from services.gateway.mcp import modes
from services.gateway.mcp.server import PRINCIPAL_SCOPE_KEY
from services.gateway.sessions.registry import GatewaySession, SessionRegistry
from shared.domain.principal import Principal
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)


def resource_metadata_url(scope: Scope) -> str:
    headers = Headers(scope=scope)
    host = headers.get("host", "localhost")
    scheme = headers.get("x-forwarded-proto", scope.get("scheme", "http"))
    return f"{scheme}://{host}/.well-known/oauth-protected-resource"


def unauthorized(scope: Scope) -> JSONResponse:
    """401 with the RFC 9728 pointer to the protected-resource metadata."""
    return JSONResponse(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Unauthorized"}},
        status_code=401,
        headers={"WWW-Authenticate": f'Bearer resource_metadata="{resource_metadata_url(scope)}"'},
    )


def transport_security(settings: GatewaySettings) -> TransportSecuritySettings:
    if settings.allowed_hosts:
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=settings.allowed_hosts,
            allowed_origins=settings.allowed_origins,
        )
    if settings.host in ("127.0.0.1", "localhost", "::1"):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    # Behind an ingress the Host is the public name; list it in MCP_ALLOWED_HOSTS to check it.
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def _as_user(principal: Principal) -> AuthenticatedUser:
    # The SDK refuses a session to any credential other than the one that opened it.
    subject = principal.key_id or "master"
    return AuthenticatedUser(AccessToken(token="", client_id=subject, scopes=list(principal.permissions or ()), subject=subject))


class Transports:
    def __init__(self, server: Server[Any], settings: GatewaySettings) -> None:
        self.server = server
        self.settings = settings
        security = transport_security(settings)
        self.streamable = StreamableHTTPSessionManager(
            app=server,
            security_settings=security,
            max_request_body_size=settings.max_body_bytes,
            session_idle_timeout=settings.session_idle_timeout.total_seconds(),
            json_response=True,
        )
        self.sse = SseServerTransport("/message", security_settings=security, max_request_body_size=settings.max_body_bytes)
        self._sse_open = asyncio.Lock()
        self.registry: SessionRegistry | None = None

    # -- Streamable HTTP ---------------------------------------------------------------
    async def mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            await unauthorized(scope)(scope, receive, send)
            return
        scope["user"] = _as_user(principal)
        session_id = Headers(scope=scope).get("mcp-session-id")
        registry = self.registry
        session = registry.get(session_id) if registry is not None else None
        if session is None or registry is None or session_id is None:
            await self.streamable.handle_request(scope, receive, send)
            return
        # An id issued by rotate arrives here already turned into its transport's (the edge).
        transport_id = session.ids.get(session_id, session_id)
        if session.ids.get(session.session_id) == transport_id and session.session_id != transport_id:
            send = _answering_as(session.session_id, send)  # tell the client the id rotate gave it
        registry.request_started(session)
        try:
            await self.streamable.handle_request(scope, receive, send)
        finally:
            registry.request_ended(session, stream=scope["method"] == "GET")

    async def end_transport(self, transport_id: str) -> None:
        """End a Streamable HTTP transport session whose logical session a reconnect took over."""
        transport = self.streamable._server_instances.pop(transport_id, None)
        self.streamable._session_owners.pop(transport_id, None)
        if transport is not None and not transport.is_terminated:
            await transport.terminate()

    async def end_session(self, session: GatewaySession, reason: str) -> None:
        """End a logical session and every transport session of it (its key was set inactive
        or deleted): its ids answer as unknown from now on, on both transports."""
        if self.registry is None:
            return
        for transport_id in list(session.transports):
            await self.registry.close(transport_id, reason)
            if session.transport == "sse":
                self._end_sse(transport_id)
            else:
                await self.end_transport(transport_id)

    def _end_sse(self, session_id: str) -> None:
        # Without its writer the SDK answers POST /message with 404; closing it ends the
        # session's serve loop, and with it the event stream.
        writer = self.sse._read_stream_writers.pop(UUID(hex=session_id), None)
        if writer is not None:
            writer.close()

    # -- legacy SSE --------------------------------------------------------------------
    async def sse_connect(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            await unauthorized(scope)(scope, receive, send)
            return
        registry = self.registry
        if registry is None:  # the app's lifespan sets it before the first request
            raise RuntimeError("session registry not set up")
        mode = modes.normalize(Headers(scope=scope).get(modes.MODE_HEADER)) or modes.normalize(principal.default_mode)
        async with AsyncExitStack() as stack:
            # connect_sse names the session itself; opening one at a time lets us learn the name.
            async with self._sse_open:
                before = set(self.sse._read_stream_writers)
                read, write = await stack.enter_async_context(self.sse.connect_sse(scope, receive, _endpoint_as_seed(send)))
                opened = set(self.sse._read_stream_writers) - before
            session_id = opened.pop().hex
            await registry.open(session_id, "sse", principal, scope.get(TOKEN_SCOPE_KEY), mode)
            try:
                await serve_loop(
                    self.server, read, write,
                    lifespan_state=self.streamable._lifespan_state,
                    session_id=session_id,
                )
            finally:
                await registry.close(session_id, "sse_disconnect")

    async def sse_message(self, scope: Scope, receive: Receive, send: Send) -> None:
        # seed: POST /message?sessionId=; the SDK reads session_id. Both spellings work.
        query = scope.get("query_string", b"")
        if b"sessionId=" in query and b"session_id=" not in query:
            query = scope["query_string"] = query.replace(b"sessionId=", b"session_id=")
        values = parse_qs(query.decode()).get("session_id")
        if values and self.registry is not None:
            transport_id = self.registry.transport_of(values[0])
            if transport_id and transport_id != values[0]:  # an id issued by rotate
                scope["query_string"] = query.replace(values[0].encode(), transport_id.encode())
        await self.sse.handle_post_message(scope, receive, send)

def _answering_as(session_id: str, send: Send) -> Send:
    """Answer with the session's current id (after a rotate) in Mcp-Session-Id."""
    value = session_id.encode()

    async def rewrite(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"mcp-session-id"]
            headers.append((b"mcp-session-id", value))
            message = {**message, "headers": headers}
        await send(message)

    return rewrite


def _endpoint_as_seed(send: Send) -> Send:
    """The endpoint event names the message URL with the seed's `sessionId` parameter."""

    async def rewrite(message: Message) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if b"event: endpoint" in body and b"session_id=" in body:
                message = {**message, "body": body.replace(b"session_id=", b"sessionId=")}
        await send(message)

    return rewrite

