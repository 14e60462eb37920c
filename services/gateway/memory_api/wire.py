"""How the memory REST API meets HTTP: credentials and scopes, the reference's split of
request errors into 400 and 422, and forwarding to recall / ingest.

Status codes (reference 001): a body that is not JSON (a 0-byte body included) is 400; a
JSON body missing a required field or holding a wrong type is 422; a query or path value
that does not parse (a misspelt enum, a limit out of range, an unknown key where the query
type denies them) is 400; the services answer 400 (limits), 404 (not in the caller's
tenant), 503 (no model). Errors are `{"error": <reason phrase>, "message": <why>}`.

Scopes: `memory_read` is Engram's `read` permission (every GET, and the namespace export
POST, which renders and stores nothing), `memory_write` is `write` (every other POST, PUT,
PATCH, DELETE); the master key holds both and sees every tenant. No credential is a 401."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.requests import HTTPConnection

from services.gateway.core.auth import OAUTH_TOKEN_PREFIX
from services.gateway.core.caller import caller, has_permission
from services.gateway.core.scope import TOKEN_SCOPE_KEY
from services.gateway.core.state import gateway_state
from shared.domain.errors import CredentialGone, InvalidParams, PermissionDenied, PolicyViolation
from shared.domain.principal import Principal


class MemoryHttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": HTTPStatus(status).phrase, "message": message}, status_code=status, headers=headers)


def _validation_status(exc: RequestValidationError, body: bytes) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors) or (not body.strip() and any(e["loc"][:1] == ("body",) for e in errors)):
        return 400, "the request body is not valid JSON"
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"][1:]) or str(first["loc"][0])
    status = 422 if first["loc"][:1] == ("body",) else 400
    return status, f"{where}: {first.get('msg', 'invalid')}"


class MemoryRoute(APIRoute):
    """Every route of the surface: request errors as the reference splits them, and the
    surface's own refusals (MemoryHttpError) as its JSON errors."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except MemoryHttpError as exc:
                return error_response(exc.status, exc.message)
            except RequestValidationError as exc:
                return error_response(*_validation_status(exc, await request.body()))

        return handle


def oauth_token(connection: HTTPConnection, token: str | None = None) -> bool:
    """Whether the request's credential is an OAuth access token. Those are issued for the MCP
    resource (/.well-known/oauth-protected-resource names {base}/mcp), so the REST surfaces
    refuse them as they would any credential minted for another audience (RFC 8707)."""
    presented = token if token is not None else connection.scope.get(TOKEN_SCOPE_KEY)
    return isinstance(presented, str) and presented.startswith(OAUTH_TOKEN_PREFIX)


def _authorized(permission: str) -> Callable[[Request], Coroutine[Any, Any, Principal]]:
    async def check(request: Request) -> Principal:
        principal = caller(request)
        if principal is not None and oauth_token(request):
            raise MemoryHttpError(401, "OAuth access tokens are for /mcp; use an API key here")
        if principal is None:
            raise MemoryHttpError(401, "an API key is required (X-API-Key or Authorization: Bearer)")
        if not has_permission(principal, permission):
            scope = "memory_read" if permission == "read" else "memory_write"
            raise MemoryHttpError(403, f"this key lacks the {scope} scope (Engram permission '{permission}')")
        return principal

    return check


MemoryRead = Depends(_authorized("read"))
MemoryWrite = Depends(_authorized("write"))


def deny_unknown_query(*allowed: str) -> Callable[[Request], Coroutine[Any, Any, None]]:
    """The reference's deny_unknown_fields query types: a key they do not declare is a 400
    (?tags= is not a filter that silently matched everything)."""

    async def check(request: Request) -> None:
        unknown = sorted(set(request.query_params) - set(allowed))
        if unknown:
            raise MemoryHttpError(400, f"unknown query parameter(s): {', '.join(unknown)}; expected one of {', '.join(allowed)}")

    return check


async def forward(request: Request, service: str, tool: str, arguments: dict[str, Any], *, status: int = 200) -> Response:
    """The call to recall / ingest, and its reply (or refusal) as HTTP. A service that does
    not answer raises Unavailable, which the front door answers 503 with Retry-After."""
    principal = caller(request)
    assert principal is not None  # noqa: S101 - every route depends on MemoryRead / MemoryWrite
    try:
        result, is_error = await gateway_state(request).upstreams.call(service, tool, arguments, principal, None)
    except (InvalidParams, PolicyViolation) as exc:
        return error_response(400, exc.message)
    except CredentialGone as exc:
        return error_response(401, exc.message)
    except PermissionDenied:
        return error_response(403, "Forbidden")
    if is_error:
        return error_response(int(result["httpStatus"]), str(result["message"]))
    if status == 204:
        return Response(status_code=204)
    return JSONResponse(result["value"], status_code=status)
