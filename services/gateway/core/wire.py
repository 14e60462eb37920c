"""The few HTTP answers every surface gives the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic_core
from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope

from services.gateway.core.scope import JSON_BODY_SCOPE_KEY

# Not a seed code: the JSON-RPC server-error range, for 401 / 403 on an MCP endpoint.
UNAUTHORIZED = -32001


def resource_metadata_url(scope: Scope) -> str:
    headers = Headers(scope=scope)
    host = headers.get("host", "localhost")
    scheme = headers.get("x-forwarded-proto", scope.get("scheme", "http"))
    return f"{scheme}://{host}/.well-known/oauth-protected-resource"


def jsonrpc_error(status: int, message: str, *, code: int = UNAUTHORIZED, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def unauthorized(scope: Scope) -> JSONResponse:
    """401 with the RFC 9728 pointer to the protected-resource metadata."""
    return jsonrpc_error(
        401, "Unauthorized", headers={"WWW-Authenticate": f'Bearer resource_metadata="{resource_metadata_url(scope)}"'}
    )


def session_not_found() -> JSONResponse:
    """MCP spec: a request naming an unknown or ended session is answered 404."""
    return jsonrpc_error(404, "Session not found", code=INVALID_REQUEST)


def session_id_missing() -> JSONResponse:
    return jsonrpc_error(400, "Bad Request: Missing session ID", code=INVALID_REQUEST)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app a body a middleware already read, then the real stream."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


@dataclass(frozen=True)
class JsonBody:
    """A request body as JSON: its value, or why it is not JSON."""

    value: Any = None
    error: ValueError | None = None


def json_body(scope: Scope, body: bytes) -> JsonBody:
    """The body parsed once per request for every layer that reads it (the front door, the
    JSON-RPC guard), with the MCP SDK's own parser (its depth limit, NaN read as a number)."""
    cached: tuple[bytes, JsonBody] | None = scope.get(JSON_BODY_SCOPE_KEY)
    if cached is not None and cached[0] == body:
        return cached[1]
    try:
        parsed = JsonBody(pydantic_core.from_json(body))
    except ValueError as exc:
        parsed = JsonBody(error=exc)
    scope[JSON_BODY_SCOPE_KEY] = (body, parsed)
    return parsed
