"""Who is calling a REST surface: the Principal the front door (core/edge.py) resolved, and
whether it holds a permission. Every surface (MCP, the admin API, the memory REST APIs of the
other references) asks here, and maps a refusal onto its own wire format."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from services.gateway.core.scope import PRINCIPAL_SCOPE_KEY
from shared.domain.principal import Principal

# The REST surfaces of references 001 and 004 also take the key in `X-API-Key`; MCP, the admin
# API and OAuth keep to `Authorization: Bearer` as reference 000 has it.
API_KEY_HEADER = "x-api-key"
API_KEY_PATH_PREFIXES = ("/api/",)


def caller(connection: HTTPConnection) -> Principal | None:
    """The authenticated caller of this request, or None (no or an unknown credential)."""
    principal: Principal | None = connection.scope.get(PRINCIPAL_SCOPE_KEY)
    return principal


def has_permission(principal: Principal, required: str | None) -> bool:
    """seed RBAC: no entry -> no check; master (permissions null) and admin pass everything."""
    if required is None or principal.permissions is None:
        return True
    return "admin" in principal.permissions or required in principal.permissions
