"""Engram's error hierarchy. Turned into wire errors in one place per surface
(JSON-RPC for MCP, HTTP status + JSON for REST)."""

from __future__ import annotations

from typing import Any

# JSON-RPC codes the reference uses.
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SYMBOLIC_POLICY_VIOLATION = -32003


class EngramError(Exception):
    """An error the caller caused or must see; carries its JSON-RPC code."""

    code: int = INTERNAL_ERROR
    http_status: int = 500

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            body["data"] = self.data
        return body


class InvalidParams(EngramError):
    code = INVALID_PARAMS
    http_status = 422


class PolicyViolation(EngramError):
    code = SYMBOLIC_POLICY_VIOLATION
    http_status = 422


class PermissionDenied(EngramError):
    # seed: -32600 with message "Internal error"; the reason stays in the server log.
    code = INVALID_REQUEST
    http_status = 403

    def __init__(self, reason: str) -> None:
        super().__init__("Internal error")
        self.reason = reason


# The gateway's JSON-RPC code for a credential that is not (or no longer) valid.
UNAUTHORIZED = -32001


class CredentialGone(EngramError):
    """The caller's API key was deleted after the gateway authenticated the call (another
    replica's key cache may lag an admin change by its lifetime without Redis)."""

    code = UNAUTHORIZED
    http_status = 401


class Unavailable(EngramError):
    code = INTERNAL_ERROR
    http_status = 503
