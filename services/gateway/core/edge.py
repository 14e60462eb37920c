"""The gateway's front door, in front of every route: body size (413), rate limits (429 +
Retry-After), the caller's Principal, the session's credential (re-checked on every request),
dependency failures as 503s (services/gateway/unavailable.py), and the MCP details that live
in HTTP rather than in JSON-RPC: token-based session reuse and the X-RateLimit-* headers."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs

from cachetools import TTLCache
from prometheus_client import Counter
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.core import unavailable
from services.gateway.core.auth import bearer_token
from services.gateway.core.limits import body_limit_for
from services.gateway.mcp.server import PRINCIPAL_SCOPE_KEY
from services.gateway.sessions.registry import GatewaySession, token_digest
from shared.domain.principal import Principal
from shared.repositories import fragments as fragments_repo

logger = logging.getLogger(__name__)

UNMETERED = ("/health", "/health/live", "/metrics")
# seed: fragment usage behind X-RateLimit-* is cached for 10 s.
USAGE_CACHE_SECONDS = 10.0
USAGE_CACHE_SIZE = 10_000
TOKEN_SCOPE_KEY = "engram.token"  # noqa: S105 - a scope key name, not a secret
# Not a seed code: the JSON-RPC server-error range, as transports.unauthorized() uses for 401.
UNAUTHORIZED = -32001

SESSIONS_REVOKED = Counter(
    "mcp_session_key_revoked_total", "MCP sessions ended because their key was set inactive or deleted", ["state"]
)
SESSION_FOREIGN_CREDENTIAL = Counter(
    "mcp_session_foreign_credential_total", "Requests refused for presenting another credential than their session's"
)


class _TooLarge(Exception):
    pass


def request_token(scope: Scope) -> str | None:
    token = bearer_token(Headers(scope=scope).get("authorization"))
    if token is None and scope["path"] == "/sse":
        # seed: legacy SSE authenticates with ?accessKey=
        values = parse_qs(scope.get("query_string", b"").decode()).get("accessKey")
        token = values[0] if values else None
    return token


class GatewayEdge:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's state, filled by its lifespan
        self._usage: TTLCache[str, int] = TTLCache(USAGE_CACHE_SIZE, USAGE_CACHE_SECONDS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNMETERED or not hasattr(self.state, "limiter"):
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._serve(scope, receive, watched)
        except unavailable.DEPENDENCY_ERRORS as exc:
            if started:  # too late for a status; the connection ends with the error
                raise
            logger.warning("%s %s: %s", scope["method"], scope["path"], unavailable.reason(exc), exc_info=True)
            await unavailable.http_response(scope["path"], exc)(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.state.settings
        body: bytes | None = None
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await self._read_body(scope, receive, body_limit_for(scope["path"], settings.max_body_bytes))
            except _TooLarge:
                await self._too_large(scope, receive, send)
                return
            receive = _replay(body, receive)

        token = request_token(scope)
        principal = await self.state.authenticator.authenticate(token) if token else None
        session = self._addressed_session(scope)
        if session is not None:
            # seed: Streamable HTTP authenticates at initialize "and the session keeps it"; the
            # key behind the session is still checked on every request, so a key set inactive
            # or deleted ends its sessions, and a session answers to no other credential.
            refusal = await self._check_session(session, token, principal)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            if token is None and (scope["path"] == "/message" or self.state.registry.speaks_for(_session_id(scope))):
                # A live session id stands for the credential that opened the session (not
                # an id a rotate replaced: that one works only with the credential itself).
                principal = session.principal
        if principal is not None:
            scope[PRINCIPAL_SCOPE_KEY] = principal
            scope[TOKEN_SCOPE_KEY] = token
        if principal is None:
            client = scope.get("client")
            allowed, retry = await self.state.limiter.hit("ip", client[0] if client else "unknown", settings.ip_rate_limit_per_min)
        elif principal.key_id is not None:
            allowed, retry = await self.state.limiter.hit("key", principal.key_id, settings.key_rate_limit_per_min)
        else:  # the master key is the operator's, not a tenant's; it is not metered
            allowed, retry = True, 0
        if not allowed:
            response = JSONResponse(
                {"error": "Too Many Requests", "retryAfter": retry}, status_code=429, headers={"Retry-After": str(retry)}
            )
            await response(scope, receive, send)
            return

        if scope["path"] == "/mcp" and principal is not None:
            send = await self._mcp(scope, body, principal, token, send)
        await self.app(scope, receive, send)

    def _addressed_session(self, scope: Scope) -> GatewaySession | None:
        """The session an MCP request names: Mcp-Session-Id on /mcp, ?sessionId= on /message."""
        registry = getattr(self.state, "registry", None)
        if registry is None or scope["path"] not in ("/mcp", "/message"):
            return None
        session: GatewaySession | None = registry.get(_session_id(scope))
        return session if session is not None and not session.closed else None

    async def _check_session(self, session: GatewaySession, token: str | None, principal: Principal | None) -> JSONResponse | None:
        """Refresh the session's principal from its key; a refusal when the key is gone or the
        request presents another credential."""
        if token is not None and principal is None:
            if session.token_digest is None or session.token_digest != token_digest(token):
                # An unknown credential: /mcp refuses it further in (401 with the resource
                # metadata); /message would otherwise serve it as the session's.
                return _jsonrpc_error(401, "Unauthorized") if session.transport == "sse" else None
            current = None  # the session's own credential no longer authenticates
        elif principal is not None:
            if principal.key_id != session.principal.key_id:
                logger.warning("request for session of key %s presented key %s; refused", session.principal.key_id, principal.key_id)
                SESSION_FOREIGN_CREDENTIAL.inc()
                return _jsonrpc_error(403, "Forbidden: this session belongs to another credential")
            current = principal  # authenticated just now, by the same key
        else:
            current = await self.state.authenticator.principal_for_key(session.principal.key_id)
        if current is None:
            key_id = session.principal.key_id
            state = await self.state.authenticator.key_state(key_id) if key_id is not None else "invalid"
            logger.info("ending session %s: key %s is %s", session.session_id, session.principal.key_id, state)
            SESSIONS_REVOKED.labels(state).inc()
            await self.state.transports.end_session(session, f"key_{state}")
            return _jsonrpc_error(
                401, f"Session ended: its API key is {state}", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )
        session.principal = current
        return None

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> bytes:
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] in ("/mcp", "/message"):
            body: dict[str, Any] = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Request body too large"}}
        else:
            body = {"error": "Payload Too Large"}
        await JSONResponse(body, status_code=413)(scope, receive, send)

    async def _mcp(self, scope: Scope, body: bytes | None, principal: Principal, token: str | None, send: Send) -> Send:
        registry = getattr(self.state, "registry", None)
        headers = Headers(scope=scope)
        session_id = headers.get("mcp-session-id")
        # seed: same Bearer, no Mcp-Session-Id -> the existing session comes back. A request
        # inside a session goes to the Bearer's latest transport session; an `initialize` opens
        # a transport session of its own (two live clients of one key never share JSON-RPC
        # ids) that continues the Bearer's idle logical session (services/gateway/sessions.py).
        if registry is not None and scope["method"] == "POST" and session_id is None and body and not _has_method(body, "initialize"):
            reused = registry.for_token(token, "streamable-http")
            if reused is not None and reused in self.state.session_manager._server_instances:
                scope["headers"] = [*scope["headers"], (b"mcp-session-id", reused.encode())]
        session = registry.get(session_id) if registry is not None else None
        if registry is not None and session is not None:
            transport_id = session.ids.get(session_id, session_id)
            if transport_id != session_id:  # an id issued by rotate: the SDK knows the transport by its own
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"mcp-session-id"]
                scope["headers"].append((b"mcp-session-id", transport_id.encode()))
            if scope["method"] == "DELETE" and session.principal.key_id == principal.key_id:
                await registry.close(transport_id, "client_delete")
        if scope["method"] != "POST" or principal.key_id is None or principal.fragment_limit is None or not body:
            return send
        if not _has_method(body, "tools/call"):
            return send
        limit = principal.fragment_limit
        used = await self._fragment_usage(principal.key_id)
        extra = [
            (b"x-ratelimit-limit", str(limit).encode()),
            (b"x-ratelimit-remaining", str(max(0, limit - used)).encode()),
            (b"x-ratelimit-resource", b"fragments"),
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return send_with_headers

    async def _fragment_usage(self, key_id: str) -> int:
        cached = self._usage.get(key_id)
        if cached is not None:
            return cached
        async with self.state.pool.acquire() as conn:
            # The same count ingest enforces the quota with (every row the key owns).
            used: int = await fragments_repo.count_owned(conn, key_id)
        self._usage[key_id] = used
        return used


def _session_id(scope: Scope) -> str | None:
    if scope["path"] == "/message":
        query = parse_qs(scope.get("query_string", b"").decode())
        values = query.get("sessionId") or query.get("session_id")
        return values[0] if values else None
    return Headers(scope=scope).get("mcp-session-id")


def _jsonrpc_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": UNAUTHORIZED, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def _has_method(body: bytes, method: str) -> bool:
    """Whether a JSON-RPC body (single or batch) carries a request for `method`."""
    try:
        message = json.loads(body)
    except ValueError:
        return False
    messages = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == method for m in messages)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
