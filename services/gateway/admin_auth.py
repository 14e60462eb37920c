"""Admin REST auth: the master key only (seed: admin endpoints need the master key)."""

from __future__ import annotations

from fastapi import HTTPException, Request

from services.gateway.auth import bearer_token


async def require_master(request: Request) -> None:
    token = bearer_token(request.headers.get("authorization"))
    principal = await request.app.state.authenticator.authenticate(token)
    if principal is None:
        raise HTTPException(status_code=401, detail="Unauthorized")
    if not principal.is_master:
        raise HTTPException(status_code=403, detail="master key required")
