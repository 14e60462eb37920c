"""The gateway's front door, in front of every route: body size (413), rate limits (429 +
Retry-After), the caller's Principal, the session's credential (re-checked on every request),
dependency failures as 503s (services/gateway/unavailable.py), and the MCP details that live
in HTTP rather than in JSON-RPC: token-based session reuse and the X-RateLimit-* headers."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs

import anyio
from cachetools import TTLCache
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from prometheus_client import Counter
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.core import unavailable
from services.gateway.core.auth import bearer_token
from services.gateway.core.caller import API_KEY_HEADER, API_KEY_PATH_PREFIXES
from services.gateway.core.limits import Hit, body_limit_for
from services.gateway.core.round_trip import Reply, RoundTrip
from services.gateway.core.scope import CALL_AHEAD_SCOPE_KEY, INITIALIZE_SCOPE_KEY, PRINCIPAL_SCOPE_KEY, SESSION_SCOPE_KEY, TOKEN_SCOPE_KEY
from services.gateway.core.state import GatewayState, state_of
from services.gateway.core.state import started as state_built
from services.gateway.core.wire import json_body, jsonrpc_error, replay_body
from services.gateway.sessions import ActiveSession, Gate, token_digest
from shared.domain.principal import Principal
from shared.repositories import fragments as fragments_repo

logger = logging.getLogger(__name__)

UNMETERED = ("/health", "/health/live", "/metrics")
# seed: fragment usage behind X-RateLimit-* is cached for 10 s.
USAGE_CACHE_SECONDS = 10.0
USAGE_CACHE_SIZE = 10_000

SESSIONS_REVOKED = Counter(
    "mcp_session_key_revoked_total", "MCP sessions ended because their key was set inactive or deleted", ["state"]
)
SESSION_FOREIGN_CREDENTIAL = Counter(
    "mcp_session_foreign_credential_total", "Requests refused for presenting another credential than their session's"
)


class _TooLarge(Exception):
    pass


def request_token(scope: Scope) -> str | None:
    headers = Headers(scope=scope)
    token = bearer_token(headers.get("authorization"))
    if token is None and scope["path"].startswith(API_KEY_PATH_PREFIXES):
        token = headers.get(API_KEY_HEADER) or None
    if token is None and scope["path"] == "/sse":
        # seed: legacy SSE authenticates with ?accessKey=
        values = parse_qs(scope.get("query_string", b"").decode()).get("accessKey")
        token = values[0] if values else None
    return token


class GatewayEdge:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._usage: TTLCache[str, int] = TTLCache(USAGE_CACHE_SIZE, USAGE_CACHE_SECONDS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNMETERED or not state_built(scope):
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
        state = state_of(scope)
        settings = state.settings
        body: bytes | None = None
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await self._read_body(scope, receive, body_limit_for(scope["path"], settings.max_body_bytes))
            except _TooLarge:
                await self._too_large(scope, receive, send)
                return
            receive = replay_body(body, receive)

        token = request_token(scope)
        if scope["path"] == "/mcp" and scope["method"] == "POST":
            # Only a request without a session id may open one (and asks for the parse).
            opening = Headers(scope=scope).get("mcp-session-id") is None and bool(body)
            scope[INITIALIZE_SCOPE_KEY] = opening and _has_method(scope, body or b"", "initialize")
        session_id = await self._addressed_session_id(state, scope, token, body)
        # What the request reads and counts in Redis, in one round trip (core/round_trip.py).
        trip = RoundTrip(state.redis)
        # The key generation checks a cached key: the token's, or the session's without one.
        checks_key = state.authenticator.is_key_shaped(token) if token else session_id is not None
        generation = state.authenticator.queue_generation(trip) if checks_key else None
        known, likely_principal = state.authenticator.last_known(token) if token else (False, None)
        tool = _tool_call(scope, body) if session_id and known and likely_principal is not None else None
        gate = self._likely_gate(state, likely_principal) if tool else None
        resolving = state.sessions.queue_resolve(trip, session_id, tool, gate)
        likely = self._likely_limit(state, scope, token, session_id)
        hit = state.limiter.queue_hit(trip, *likely) if likely is not None else None
        await trip.run()

        principal = await state.authenticator.authenticate(token, generation) if token else None
        session = await state.sessions.resolved(resolving)
        ahead = await state.sessions.called_ahead(resolving, session, tool) if tool else None
        if ahead is None:
            await self._checked(state, scope, receive, send, body, token, principal, session, generation, hit, likely)
            return
        # The tool call was recorded in the round trip; the MCP handler takes it once its checks
        # pass. One refused before (here, or further in) did not happen: it is taken back.
        scope[CALL_AHEAD_SCOPE_KEY] = ahead
        try:
            await self._checked(state, scope, receive, send, body, token, principal, session, generation, hit, likely)
        finally:
            if not ahead.taken:
                with anyio.CancelScope(shield=True):
                    await state.sessions.take_back(ahead)

    async def _checked(
        self, state: GatewayState, scope: Scope, receive: Receive, send: Send, body: bytes | None, token: str | None,
        principal: Principal | None, session: ActiveSession | None, generation: Reply | None, hit: Hit | None,
        likely: tuple[str, str, int] | None,
    ) -> None:
        """The request past the round trip: the session's checks, the rate limit, then the app."""
        if session is not None:
            # seed: Streamable HTTP authenticates at initialize "and the session keeps it"; the
            # key behind the session is still checked on every request, so a key set inactive
            # or deleted ends its sessions, and a session answers to no other credential.
            refusal, current = await self._check_session(state, session, token, principal, generation)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            if token is None and (scope["path"] == "/message" or not session.retired):
                # A live session id stands for the credential that opened the session (not
                # an id a rotate replaced: that one works only with the credential itself).
                principal = current
            scope[SESSION_SCOPE_KEY] = session
        if principal is not None:
            scope[PRINCIPAL_SCOPE_KEY] = principal
            scope[TOKEN_SCOPE_KEY] = token
        limit = self._limit(state, scope, principal)
        if limit is None:
            allowed, retry = True, 0
        elif hit is not None and likely == limit:
            allowed, retry = state.limiter.counted(hit)
        else:  # not known before the round trip (a first request, a key that changed): counted now
            allowed, retry = await state.limiter.hit(*limit)
        if not allowed:
            response = JSONResponse(
                {"error": "Too Many Requests", "retryAfter": retry}, status_code=429, headers={"Retry-After": str(retry)}
            )
            await response(scope, receive, send)
            return

        if scope["path"] == "/mcp" and principal is not None:
            send = await self._usage_headers(state, scope, body, principal, send)
        await self.app(scope, receive, send)

    @staticmethod
    def _limit(state: GatewayState, scope: Scope, principal: Principal | None) -> tuple[str, str, int] | None:
        """The rate limit a request is counted against: its key's, or its IP's without one
        (None: the master key, the operator's, not a tenant's, is not metered)."""
        if principal is None:
            client = scope.get("client")
            return "ip", client[0] if client else "unknown", state.settings.ip_rate_limit_per_min
        if principal.key_id is None:
            return None
        return "key", principal.key_id, state.settings.key_rate_limit_per_min

    @staticmethod
    def _likely_gate(state: GatewayState, principal: Principal | None) -> Gate | None:
        """The daily-limit gate the MCP handler will count a tool call on (the same call)."""
        if principal is None or principal.key_id is None or principal.daily_limit is None:
            return None
        return state.daily_calls.gate(principal.key_id, principal.daily_limit)

    def _likely_limit(
        self, state: GatewayState, scope: Scope, token: str | None, session_id: str | None
    ) -> tuple[str, str, int] | None:
        """The limit to count in the round trip, before the credential is checked: from what
        the token was when last checked here. None when unknown (a token not seen within the
        key cache's lifetime, or a session id standing in for its credential): the request is
        then counted after its round trip, once known."""
        if token is None:
            return None if session_id else self._limit(state, scope, None)
        known, principal = state.authenticator.last_known(token)
        return self._limit(state, scope, principal) if known else None

    async def _addressed_session_id(
        self, state: GatewayState, scope: Scope, token: str | None, body: bytes | None
    ) -> str | None:
        """The session an MCP request names: Mcp-Session-Id on /mcp, ?sessionId= on /message."""
        if scope["path"] not in ("/mcp", "/message"):
            return None
        session_id = _session_id(scope)
        if session_id is None and scope["path"] == "/mcp" and scope["method"] == "POST" and not scope[INITIALIZE_SCOPE_KEY] and body:
            # seed: same Bearer, no Mcp-Session-Id -> the existing session comes back. A request
            # inside a session goes to the Bearer's latest client id; an `initialize` gets an id
            # of its own (two live clients of one key never share JSON-RPC ids) that continues
            # the Bearer's idle logical session (services/gateway/sessions/).
            session_id = await state.sessions.for_token(token, "streamable-http")
        return session_id

    async def _check_session(
        self, state: GatewayState, session: ActiveSession, token: str | None, principal: Principal | None,
        generation: Reply | None,
    ) -> tuple[JSONResponse | None, Principal | None]:
        """The session's principal, fresh from its key; or a refusal when the key is gone or
        the request presents another credential."""
        if token is not None and principal is None:
            if session.token_digest is None or session.token_digest != token_digest(token):
                # An unknown credential: /mcp refuses it further in (401 with the resource
                # metadata); /message would otherwise serve it as the session's.
                return (jsonrpc_error(401, "Unauthorized") if session.transport == "sse" else None), None
            current = None  # the session's own credential no longer authenticates
        elif principal is not None:
            if principal.key_id != session.key_id:
                logger.warning("request for session of key %s presented key %s; refused", session.key_id, principal.key_id)
                SESSION_FOREIGN_CREDENTIAL.inc()
                return jsonrpc_error(403, "Forbidden: this session belongs to another credential"), None
            current = principal  # authenticated just now, by the same key
        else:
            current = await state.authenticator.principal_for_key(session.key_id, generation)
        if current is None:
            key_id = session.key_id
            key_state = await state.authenticator.key_state(key_id) if key_id is not None else "invalid"
            logger.info("ending session %s: key %s is %s", session.session_id, key_id, key_state)
            SESSIONS_REVOKED.labels(key_state).inc()
            await state.sessions.end(session, f"key_{key_state}")
            state.mcp.end_sse(session.transport_id)
            refusal = jsonrpc_error(
                401, f"Session ended: its API key is {key_state}", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )
            return refusal, None
        return None, current

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

    async def _usage_headers(
        self, state: GatewayState, scope: Scope, body: bytes | None, principal: Principal, send: Send
    ) -> Send:
        if scope["method"] != "POST" or principal.key_id is None or principal.fragment_limit is None or not body:
            return send
        if not _has_method(scope, body, "tools/call"):
            return send
        limit = principal.fragment_limit
        used = await self._fragment_usage(state, principal.key_id)
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

    async def _fragment_usage(self, state: GatewayState, key_id: str) -> int:
        cached = self._usage.get(key_id)
        if cached is not None:
            return cached
        async with state.pool.acquire() as conn:
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


def _tool_call(scope: Scope, body: bytes | None) -> str | None:
    """The tool a POST /mcp of a session calls, when its body is one tools/call request of
    the protocol era this gateway serves itself (services/gateway/mcp/exchange.py)."""
    if scope["path"] != "/mcp" or scope["method"] != "POST" or not body:
        return None
    version = Headers(scope=scope).get("mcp-protocol-version")
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    message = json_body(scope, body).value
    if not isinstance(message, dict) or message.get("method") != "tools/call" or "id" not in message:
        return None
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None


def _has_method(scope: Scope, body: bytes, method: str) -> bool:
    """Whether a JSON-RPC body (single or batch) carries a request for `method`."""
    message = json_body(scope, body).value  # None when no JSON: JsonRpcGuard answers it
    messages = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == method for m in messages)

