"""The MCP transports: Streamable HTTP (/mcp) and legacy SSE (GET /sse + POST /message).

Streamable HTTP is stateless in the SDK (a fresh transport per request, no session map in
this process); the gateway owns Mcp-Session-Id: an `initialize` that succeeds gets a new id
(services/gateway/sessions/), every later request was resolved by the front door and carries
its session in the ASGI scope, so any replica serves any request. GET /mcp is served here: an
event stream of keep-alive comments (Engram sends no server-initiated messages) that ends when
the session does. DELETE ends the session.

Legacy SSE stays with the replica that holds its stream; a POST /message that reaches another
replica is forwarded to the holder (its internal URL is kept with the session), or refused
with a clear error when the holder is gone."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_loop
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types import JSONRPCRequest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from services.gateway.core.scope import (
    INITIALIZE_SCOPE_KEY,
    MESSAGE_SCOPE_KEY,
    OPENED_SCOPE_KEY,
    PRINCIPAL_SCOPE_KEY,
    SESSION_SCOPE_KEY,
    TOKEN_SCOPE_KEY,
)
from services.gateway.core.wire import jsonrpc_error, session_id_missing, session_not_found, unauthorized
from services.gateway.mcp import modes
from services.gateway.mcp.exchange import JsonExchange
from services.gateway.sessions import ActiveSession, Sessions
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

# How often an open GET stream looks whether its session still lives, and sends a comment.
STREAM_POLL_SECONDS = 1.0
KEEPALIVE_SECONDS = 15.0
_ENDPOINT_SESSION = re.compile(rb"session_id=([0-9a-f]{32})")
# Marks a /message forwarded by another replica (it is not forwarded again).
FORWARDED_HEADER = "x-engram-forwarded-by"
FORWARD_TIMEOUT_SECONDS = 30.0


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


class Transports:
    def __init__(self, server: Server[Any], settings: GatewaySettings, sessions: Sessions) -> None:
        self.server = server
        self.sessions = sessions
        self.internal_url = settings.internal_url
        self._forward = httpx.AsyncClient(timeout=FORWARD_TIMEOUT_SECONDS)
        security = transport_security(settings)
        self.streamable = StreamableHTTPSessionManager(
            app=server,
            security_settings=security,
            max_request_body_size=settings.max_body_bytes,
            stateless=True,
            json_response=True,
        )
        self.sse = SseServerTransport("/message", security_settings=security, max_request_body_size=settings.max_body_bytes)
        # GET and DELETE are served here, not by the SDK: the same Host / Origin checks.
        self.security = TransportSecurityMiddleware(security)
        self.exchange = JsonExchange(server, self.security)
        # Legacy SSE sessions whose stream this replica holds -> the cancel scope of its loop.
        self._sse_streams: dict[str, anyio.CancelScope] = {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, and the server's lifespan for the requests served here."""
        async with self.streamable.run(), self.exchange.running():
            yield

    # -- Streamable HTTP ---------------------------------------------------------------
    async def mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get(PRINCIPAL_SCOPE_KEY) is None:
            await unauthorized(scope)(scope, receive, send)
            return
        headers = Headers(scope=scope)
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # The sessionless protocol era: the SDK serves it whole.
            await self.streamable.handle_request(scope, receive, send)
            return
        session: ActiveSession | None = scope.get(SESSION_SCOPE_KEY)
        if session is None:
            if headers.get("mcp-session-id") is not None:
                await session_not_found()(scope, receive, send)
            elif scope["method"] == "POST" and scope.get(INITIALIZE_SCOPE_KEY):
                await self.streamable.handle_request(scope, receive, _naming_opened(scope, send))
            else:
                await session_id_missing()(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            refused = await self.security.validate_request(Request(scope, receive), is_post=False)
            if refused is not None:
                await refused(scope, receive, send)
                return
        if scope["method"] == "GET":
            # Counted open before the client can see it, closed as soon as the client goes.
            await self.sessions.stream_opened(session)
            try:
                await self._stream(session)(scope, receive, send)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.sessions.stream_closed(session)
        elif scope["method"] == "DELETE":
            await self.sessions.detach(session, "client_delete")
            await Response(status_code=200)(scope, receive, send)
        elif isinstance(message := scope.get(MESSAGE_SCOPE_KEY), JSONRPCRequest) and message.method != "initialize":
            await self.exchange(scope, receive, _naming(session.current_client_id, send), message)
        else:
            await self.streamable.handle_request(scope, receive, _naming(session.current_client_id, send))

    def _stream(self, session: ActiveSession) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            waited = 0.0
            while await self.sessions.resolve(session.client_id, touch=False) is not None:
                await anyio.sleep(STREAM_POLL_SECONDS)
                waited += STREAM_POLL_SECONDS
                if waited >= KEEPALIVE_SECONDS:
                    waited = 0.0
                    yield ": keep-alive\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream",
            headers={"mcp-session-id": session.current_client_id, "cache-control": "no-cache, no-transform"},
        )

    # -- legacy SSE --------------------------------------------------------------------
    async def sse_connect(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            await unauthorized(scope)(scope, receive, send)
            return
        mode = modes.normalize(Headers(scope=scope).get(modes.MODE_HEADER)) or modes.normalize(principal.default_mode)
        opened: list[ActiveSession] = []
        ready = anyio.Event()
        with anyio.CancelScope() as cancel:

            async def on_named(client_id: str) -> None:
                # Before the client learns the id: its first POST /message may come at once.
                opened.append(await self.sessions.open(
                    "sse", principal, scope.get(TOKEN_SCOPE_KEY), mode, client_id=client_id, owner=self.internal_url
                ))
                self._sse_streams[client_id] = cancel
                self.sessions.held_sse.add(client_id)
                ready.set()

            # mcp 2.3.0 has no public hook that names an SSE session; its endpoint event does.
            async with self.sse.connect_sse(scope, receive, _endpoint_as_seed(send, on_named)) as (read, write):
                with anyio.fail_after(10):
                    await ready.wait()
                session = opened[0]
                try:
                    await serve_loop(self.server, read, write, lifespan_state={}, session_id=session.client_id)
                finally:
                    self._sse_streams.pop(session.client_id, None)
                    self.sessions.held_sse.discard(session.client_id)
                    with anyio.CancelScope(shield=True):
                        await self.sessions.detach(session, "sse_disconnect")

    def end_sse(self, client_id: str) -> None:
        """End a legacy SSE stream this replica holds (its session ended: key revoked)."""
        cancel = self._sse_streams.get(client_id)
        if cancel is not None:
            cancel.cancel()

    async def sse_message(self, scope: Scope, receive: Receive, send: Send) -> None:
        session: ActiveSession | None = scope.get(SESSION_SCOPE_KEY)
        if session is None:
            await jsonrpc_error(404, "Could not find session", code=-32600)(scope, receive, send)
            return
        if session.transport_id not in self._sse_streams:
            await self._to_holder(session, scope, receive, send)
            return
        # seed: POST /message?sessionId=; the SDK reads session_id, with the id of the stream.
        scope["query_string"] = f"session_id={session.transport_id}".encode()
        await self.sse.handle_post_message(scope, receive, send)


    async def _to_holder(self, session: ActiveSession, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward a /message to the replica that holds the session's stream."""
        headers = Headers(scope=scope)
        owner = session.owner
        if owner is None or owner == self.internal_url or headers.get(FORWARDED_HEADER):
            await jsonrpc_error(404, "Could not find session", code=-32600)(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        query = scope.get("query_string", b"").decode()
        forwarded = {k: v for k, v in headers.items() if k in ("authorization", "content-type", "host", "origin", "mcp-protocol-version")}
        forwarded[FORWARDED_HEADER] = self.internal_url
        try:
            reply = await self._forward.post(f"{owner}/message?{query}", content=body, headers=forwarded)
        except httpx.HTTPError:
            logger.warning("legacy SSE session %s: its replica %s does not answer", session.client_id, owner)
            gone = "This legacy SSE session's stream was on a gateway replica that is gone; reconnect"
            await jsonrpc_error(404, gone, code=-32600)(scope, receive, send)
            return
        media = reply.headers.get("content-type")
        await Response(reply.content, status_code=reply.status_code, media_type=media)(scope, receive, send)

    async def aclose(self) -> None:
        await self._forward.aclose()


def _naming(client_id: str, send: Send) -> Send:
    """Answer with the session's current id in Mcp-Session-Id (a rotate gives a new one)."""
    value = client_id.encode()

    async def rewrite(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"mcp-session-id"]
            headers.append((b"mcp-session-id", value))
            message = {**message, "headers": headers}
        await send(message)

    return rewrite


def _naming_opened(scope: Scope, send: Send) -> Send:
    """An initialize names the session it opened (the handler put it in the scope)."""

    async def rewrite(message: Message) -> None:
        opened: ActiveSession | None = scope.get(OPENED_SCOPE_KEY)
        if message["type"] == "http.response.start" and opened is not None:
            message = {**message, "headers": [*message.get("headers", []), (b"mcp-session-id", opened.client_id.encode())]}
        await send(message)

    return rewrite


def _endpoint_as_seed(send: Send, on_named: Callable[[str], Awaitable[None]]) -> Send:
    """The endpoint event names the message URL with the seed's `sessionId` parameter."""

    async def rewrite(message: Message) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            found = _ENDPOINT_SESSION.search(body) if b"event: endpoint" in body else None
            if found is not None:
                await on_named(found.group(1).decode())
                message = {**message, "body": body.replace(b"session_id=", b"sessionId=")}
        await send(message)

    return rewrite
