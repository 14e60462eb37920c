"""Admin routes reach recall and ingest as the master key, like the import route does: the
gateway maps the wire, the services own the memory logic. Errors become HTTP statuses here."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import HTTPException, Request

from services.gateway.core.state import gateway_state
from shared.domain.errors import EngramError, InvalidParams, PolicyViolation, Unavailable
from shared.domain.principal import Principal


async def call_as_master(
    request: Request, service: Literal["recall", "ingest"], tool: str, arguments: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """The tool's (result, isError); 503 when the service does not answer, 422 for arguments
    it refused (the field named), 400 for a policy refusal."""
    try:
        return await gateway_state(request).upstreams.call(service, tool, arguments, Principal.master(), None)
    except Unavailable as exc:
        raise HTTPException(status_code=503, detail=exc.message, headers={"Retry-After": "1"}) from None
    except InvalidParams as exc:
        raise HTTPException(status_code=422, detail=exc.message) from None
    except PolicyViolation as exc:
        raise HTTPException(status_code=400, detail={"error": exc.message, "data": exc.data}) from None
    except EngramError as exc:
        raise HTTPException(status_code=502, detail=f"{service}: {exc.message}") from None


async def view(request: Request, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """One of recall's admin views (services/recall/admin_views.py)."""
    result, _ = await call_as_master(request, "recall", name, arguments or {})
    return result
