"""The MCP transports: Streamable HTTP (/mcp) and legacy SSE (GET /sse + POST /message),
both served by the SDK around one low-level Server."""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import AsyncExitStack
from typing import Any

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

from services.gateway import modes
from services.gateway.edge import TOKEN_SCOPE_KEY
from services.gateway.mcp_server import PRINCIPAL_SCOPE_KEY
from services.gateway.sessions import GatewaySession, SessionRegistry
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
        await self.streamable.handle_request(scope, receive, send)

    # -- legacy SSE --------------------------------------------------------------------
    async def sse_connect(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            await unauthorized(scope)(scope, receive, send)
            return
        assert self.registry is not None
        mode = modes.normalize(Headers(scope=scope).get(modes.MODE_HEADER)) or modes.normalize(principal.default_mode)
        async with AsyncExitStack() as stack:
            # connect_sse names the session itself; opening one at a time lets us learn the name.
            async with self._sse_open:
                before = set(self.sse._read_stream_writers)  # noqa: SLF001
                read, write = await stack.enter_async_context(self.sse.connect_sse(scope, receive, _endpoint_as_seed(send)))
                opened = set(self.sse._read_stream_writers) - before  # noqa: SLF001
            session_id = opened.pop().hex
            session = await self.registry.open(session_id, "sse", principal, scope.get(TOKEN_SCOPE_KEY), mode)
            try:
                await serve_loop(
                    self.server, read, write,
                    lifespan_state=self.streamable._lifespan_state,  # noqa: SLF001 - the manager's lifespan, entered once
                    session_id=session_id,
                )
            finally:
                await self.registry.close(session.session_id, "sse_disconnect")

    async def sse_message(self, scope: Scope, receive: Receive, send: Send) -> None:
        # seed: POST /message?sessionId=; the SDK reads session_id. Both spellings work.
        query = scope.get("query_string", b"")
        if b"sessionId=" in query and b"session_id=" not in query:
            scope["query_string"] = query.replace(b"sessionId=", b"session_id=")
        await self.sse.handle_post_message(scope, receive, send)

    # -- rotation ----------------------------------------------------------------------
    def rekey(self, session: GatewaySession, old_id: str, new_id: str) -> bool:
        """Serve the live transport under its new id; the old id answers 404 from now on."""
        if session.transport == "streamable-http":
            instances = self.streamable._server_instances  # noqa: SLF001
            owners = self.streamable._session_owners  # noqa: SLF001
            transport = instances.pop(old_id, None)
            if transport is None:
                return False
            transport.mcp_session_id = new_id
            instances[new_id] = transport
            if old_id in owners:
                owners[new_id] = owners.pop(old_id)
            return True
        writers = self.sse._read_stream_writers  # noqa: SLF001
        writer = writers.pop(uuid.UUID(hex=old_id), None)
        if writer is None:
            return False
        writers[uuid.UUID(hex=new_id)] = writer
        return True

    def forget(self, session_id: str) -> None:
        """Drop a rotated transport the SDK can no longer find by its original id."""
        transport = self.streamable._server_instances.get(session_id)  # noqa: SLF001
        if transport is not None and transport.is_terminated:
            self.streamable._server_instances.pop(session_id, None)  # noqa: SLF001
            self.streamable._session_owners.pop(session_id, None)  # noqa: SLF001


def _endpoint_as_seed(send: Send) -> Send:
    """The endpoint event names the message URL with the seed's `sessionId` parameter."""

    async def rewrite(message: Message) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if b"event: endpoint" in body and b"session_id=" in body:
                message = {**message, "body": body.replace(b"session_id=", b"sessionId=")}
        await send(message)

    return rewrite

