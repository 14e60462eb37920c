"""Admin REST auth: the master key only (seed: admin endpoints need the master key)."""

from __future__ import annotations

from fastapi import HTTPException, Request

from services.gateway.core.auth import OAUTH_TOKEN_PREFIX, bearer_token
from services.gateway.core.state import gateway_state


async def require_master(request: Request) -> None:
    token = bearer_token(request.headers.get("authorization"))
    if token is not None and token.startswith(OAUTH_TOKEN_PREFIX):
        # An OAuth access token (even one consented with the master key) is for /mcp only: the
        # admin API is the master key's, typed by the operator, never a delegated token.
        raise HTTPException(status_code=401, detail="Unauthorized")
    principal = await gateway_state(request).authenticator.authenticate(token)
    if principal is None:
        raise HTTPException(status_code=401, detail="Unauthorized")
    if not principal.is_master:
        raise HTTPException(status_code=403, detail="master key required")
    # Postgres refuses NUL in text: a path or query value holding one is a 422, not a 500.
    if any("\x00" in str(value) for value in (*request.path_params.values(), *request.query_params.values())):
        raise HTTPException(status_code=422, detail="path and query values must not contain the NUL character")
