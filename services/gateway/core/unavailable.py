"""A dependency that is down, as a wire error, in one place for each surface: Postgres
unreachable (refused, reset, a pooled connection whose server went away, a pool or connect
timeout) or an internal service (recall, ingest) down answers 503 with Retry-After: a JSON
body on HTTP routes, a JSON-RPC error on /mcp and /message. Never a bare 500: the caller's
request was fine and is worth retrying.

seed: no JSON-RPC code is named for an unavailable dependency; -32603 (internal error) is
JSON-RPC's own for a server that cannot answer, and the message says what is down."""

from __future__ import annotations

from typing import Any

import asyncpg
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse

from shared.domain.errors import INTERNAL_ERROR, Unavailable

# The pool reconnects on its own once Postgres is back; a client retrying after this long
# finds it (or gets this answer again, cheaply).
RETRY_AFTER_SECONDS = 5

DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    # ConnectionRefusedError / reset / unreachable sockets, and TimeoutError (pool acquire,
    # connect): all OSError.
    OSError,
    # A pooled connection whose server went away, a failed connection attempt (SQLSTATE 08).
    asyncpg.PostgresConnectionError,
    # The server shutting down or still starting (57P01..57P03).
    asyncpg.exceptions.OperatorInterventionError,
    # Out of connections (53300).
    asyncpg.exceptions.InsufficientResourcesError,
    # An internal service (recall, ingest) unreachable, timed out or answering an error page.
    Unavailable,
)

JSONRPC_PATHS = ("/mcp", "/message")


def reason(exc: BaseException) -> str:
    if isinstance(exc, Unavailable):
        return exc.message
    return "database unavailable"


def http_response(path: str, exc: BaseException) -> JSONResponse:
    """The 503 for a request a dependency failed: JSON-RPC on the MCP transports, else JSON."""
    message = _message(exc)
    body: dict[str, Any]
    if path in JSONRPC_PATHS:
        error = {"code": INTERNAL_ERROR, "message": message, "data": {"retryAfter": RETRY_AFTER_SECONDS}}
        body = {"jsonrpc": "2.0", "id": None, "error": error}
    else:
        body = {"error": "Service Unavailable", "message": message, "retryAfter": RETRY_AFTER_SECONDS}
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def mcp_error(exc: BaseException) -> MCPError:
    """The JSON-RPC error of a request a dependency failed inside the MCP session (its HTTP
    reply, if any, was already chosen by the transport)."""
    return MCPError(code=INTERNAL_ERROR, message=_message(exc), data={"retryAfter": RETRY_AFTER_SECONDS})


def _message(exc: BaseException) -> str:
    return f"Service unavailable: {reason(exc)}; retry later"
