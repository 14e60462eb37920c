"""The gateway's front door, in front of every route: body size (413), rate limits (429 +
Retry-After), the caller's Principal, and the MCP details that live in HTTP rather than in
JSON-RPC: token-based session reuse and the X-RateLimit-* headers."""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.auth import bearer_token
from services.gateway.limits import body_limit_for
from services.gateway.mcp_server import PRINCIPAL_SCOPE_KEY
from shared.domain.principal import Principal
from shared.repositories import fragments as fragments_repo

logger = logging.getLogger(__name__)

UNMETERED = ("/health", "/metrics")
# seed: fragment usage behind X-RateLimit-* is cached for 10 s.
USAGE_CACHE_SECONDS = 10.0
TOKEN_SCOPE_KEY = "engram.token"


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
        self._usage: dict[str, tuple[float, int]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNMETERED or not hasattr(self.state, "limiter"):
            await self.app(scope, receive, send)
            return
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
        if principal is None and token is None and scope["path"] == "/mcp":
            # seed: Streamable HTTP authenticates at initialize "and the session keeps it":
            # a live session id stands for the credential that opened the session (not an id
            # a rotate replaced: that one works only with the credential itself).
            session = getattr(self.state, "registry", None) and self.state.registry.speaks_for(Headers(scope=scope).get("mcp-session-id"))
            principal = session.principal if session is not None else None
        if principal is not None:
            scope[PRINCIPAL_SCOPE_KEY] = principal
            scope[TOKEN_SCOPE_KEY] = token
        metered = principal
        if metered is None and scope["path"] == "/message":
            # Legacy SSE posts carry no credential; they count against the key that opened the stream.
            session = self._sse_session(scope)
            metered = session.principal if session is not None else None
        if metered is None:
            client = scope.get("client")
            allowed, retry = await self.state.limiter.hit("ip", client[0] if client else "unknown", settings.ip_rate_limit_per_min)
        elif metered.key_id is not None:
            allowed, retry = await self.state.limiter.hit("key", metered.key_id, settings.key_rate_limit_per_min)
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

    def _sse_session(self, scope: Scope) -> Any:
        registry = getattr(self.state, "registry", None)
        query = parse_qs(scope.get("query_string", b"").decode())
        values = query.get("sessionId") or query.get("session_id")
        return registry.get(values[0]) if registry is not None and values else None

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
            if reused is not None and reused in self.state.session_manager._server_instances:  # noqa: SLF001
                scope["headers"] = [*scope["headers"], (b"mcp-session-id", reused.encode())]
        session = registry.get(session_id) if registry is not None else None
        if session is not None:
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
        now = time.monotonic()
        cached = self._usage.get(key_id)
        if cached and cached[0] > now:
            return cached[1]
        async with self.state.pool.acquire() as conn:
            # The same count ingest enforces the quota with (every row the key owns).
            used = await fragments_repo.count_owned(conn, key_id)
        if len(self._usage) > 10_000:
            self._usage.clear()
        self._usage[key_id] = (now + USAGE_CACHE_SECONDS, used)
        return used


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
