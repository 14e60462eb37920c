"""The mnemory REST surface's one way to recall and ingest: an internal tool call for the
caller, its refusals as reference 004's HTTP errors ({"detail": message})."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request

from services.common.rpc import UpstreamError
from services.gateway.core.state import gateway_state
from services.gateway.mnemory_api.auth import MnemoryCaller
from shared.domain.errors import CredentialGone, InvalidParams, PermissionDenied, PolicyViolation


async def call(request: Request, service: str, tool: str, who: MnemoryCaller, arguments: dict[str, Any]) -> dict[str, Any]:
    """The tool's result; an HTTPException for a refusal. Unavailable passes to the front
    door, which answers 503 with Retry-After (core/unavailable.py)."""
    arguments = {**arguments, "caller_agent_id": who.agent_id}
    try:
        result, is_error = await gateway_state(request).upstreams.call(service, tool, arguments, who.principal, None)
    except (InvalidParams, PolicyViolation) as exc:
        raise HTTPException(status_code=422, detail=exc.message) from None
    except (PermissionDenied, CredentialGone) as exc:
        raise HTTPException(status_code=exc.http_status, detail=exc.message) from None
    except UpstreamError as exc:
        raise HTTPException(status_code=400, detail=exc.message) from None
    if is_error:
        raise HTTPException(status_code=int(result.get("status", 400)), detail=str(result.get("message") or result.get("error")))
    return result
