"""The JSON-RPC envelope check in front of both MCP transports (POST /mcp and legacy
POST /message): a message the SDK would take for something it is not is answered at once.

JSON-RPC 2.0 §4 and MCP: a request's id is a string or an integer. The SDK reads a message
whose id is anything else (1.5, NaN, an object, an array, null) as a notification, answers
202 and never replies; on /message it logs every unparsable body at ERROR with a stack
trace. Here such a message gets an error response with id null (§5: the id could not be
read), HTTP 400, and one DEBUG line and a counter instead of a trace:

- not JSON                                  -> -32700 Parse error
- a batch (an array; MCP since 2025-06-18
  has none, and the SDK reads none)         -> -32600 Invalid Request
- not an object, a bad id, no valid
  request / notification / response shape   -> -32600 Invalid Request
"""

from __future__ import annotations

import logging
from typing import Any

from mcp_types import INVALID_REQUEST, PARSE_ERROR, JSONRPCMessage, jsonrpc_message_adapter
from prometheus_client import Counter
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.core.scope import MESSAGE_SCOPE_KEY, PRINCIPAL_SCOPE_KEY
from services.gateway.core.wire import JsonBody, json_body, replay_body

logger = logging.getLogger(__name__)

MALFORMED = Counter("mcp_malformed_messages_total", "JSON-RPC messages refused before the MCP SDK", ["path", "reason"])
GUARDED_PATHS = ("/mcp", "/message")


def _id_problem(message: dict[str, Any]) -> str | None:
    if "id" not in message:
        return None  # a notification
    request_id = message["id"]
    # bool is an int to Python, not to JSON.
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        return None
    return "id must be a string or an integer"


def envelope_problem(parsed: JsonBody) -> tuple[int, str, str] | JSONRPCMessage:
    """(code, message, metric reason) for a body that is no single valid JSON-RPC message;
    else the message."""
    if parsed.error is not None:
        return PARSE_ERROR, f"Parse error: {parsed.error}", "parse"
    message = parsed.value
    if isinstance(message, list):
        return INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not supported", "batch"
    if not isinstance(message, dict):
        return INVALID_REQUEST, "Invalid Request: a JSON-RPC message is an object", "not_object"
    problem = _id_problem(message)
    if problem:
        return INVALID_REQUEST, f"Invalid Request: {problem}", "id"
    try:
        return jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError:
        return INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response", "shape"


class JsonRpcGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        if path == "/mcp" and scope.get(PRINCIPAL_SCOPE_KEY) is None:
            await self.app(scope, receive, send)  # the transport answers 401 first
            return
        body = await _read(receive)
        found = envelope_problem(json_body(scope, body))
        if not isinstance(found, tuple):
            # The transport serves a request of a session from this (mcp/exchange.py).
            scope[MESSAGE_SCOPE_KEY] = found
            await self.app(scope, replay_body(body, receive), send)
            return
        code, message, reason = found
        MALFORMED.labels(path, reason).inc()
        logger.debug("refused a malformed JSON-RPC message on %s: %s", path, message)
        response = JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}, status_code=400)
        await response(scope, receive, send)


async def _read(receive: Receive) -> bytes:
    # The edge has bounded the body already (413 past MAX_BODY_BYTES).
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)

