"""Who calls the mnemory REST surface (reference 004): an Engram API key (Bearer or X-API-Key,
resolved by the front door, core/edge.py), or an ES256 JWT with aud=mnemory, verified here
with PyJWT against MNEMORY_JWT_PUBLIC_KEY (a PEM file) or MNEMORY_JWKS_URL, issuer
MNEMORY_JWT_ISSUER, `exp` required. The token acts as the Engram key whose id is its
MNEMORY_JWT_KEY_CLAIM claim (`sub` by default); an inactive or deleted key refuses it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import jwt
from fastapi import HTTPException, Request
from jwt import InvalidTokenError, PyJWKClient

from services.gateway.core.auth import OAUTH_TOKEN_PREFIX, bearer_token
from services.gateway.core.caller import caller, has_permission
from services.gateway.core.scope import TOKEN_SCOPE_KEY
from services.gateway.core.state import gateway_state
from shared.domain.fragment import MAX_ID_CHARS
from shared.domain.principal import Principal
from shared.memory_sessions import InProcessMemorySessions
from shared.settings import MnemorySettings

logger = logging.getLogger(__name__)

AUDIENCE = "mnemory"
# Only ES256: an HS256 token signed with the public key as its secret, or alg "none", is refused.
ALGORITHMS = ["ES256"]
JWKS_CACHE_SECONDS = 300
JWKS_TIMEOUT_SECONDS = 5
AGENT_HEADER = "x-agent-id"
_UNAUTHORIZED = "Unauthorized: an API key (Authorization: Bearer or X-API-Key) or an ES256 JWT (aud=mnemory) is required"


class JwtVerifier:
    def __init__(self, settings: MnemorySettings) -> None:
        if settings.jwt_public_key and settings.jwks_url:
            raise ValueError("Configure only one JWT verifier source: MNEMORY_JWT_PUBLIC_KEY or MNEMORY_JWKS_URL")
        self.settings = settings
        self._public_key = Path(settings.jwt_public_key).read_text(encoding="utf-8") if settings.jwt_public_key else None
        self._jwks = (
            PyJWKClient(settings.jwks_url, cache_jwk_set=True, lifespan=JWKS_CACHE_SECONDS, timeout=JWKS_TIMEOUT_SECONDS)
            if settings.jwks_url else None
        )

    @property
    def enabled(self) -> bool:
        return self._public_key is not None or self._jwks is not None

    def claims(self, token: str) -> dict[str, Any]:
        """The token's claims; InvalidTokenError for any signature, algorithm, audience,
        issuer or expiry problem. Blocking (a JWKS fetch): call it in a thread."""
        key: Any = self._public_key
        if self._jwks is not None:
            try:
                signing_key = self._jwks.get_signing_key_from_jwt(token)
            except jwt.PyJWKClientError as exc:
                raise InvalidTokenError(f"signing key not found: {exc}") from exc
            # kid confusion: a token naming a JWKS entry of another kind (a symmetric "oct" or an
            # RSA key) is refused here; PyJWT would raise ValueError (a 500) preparing it for ES256.
            if signing_key.key_type != "EC":
                raise InvalidTokenError(f"signing key {signing_key.key_id!r} is not an EC key")
            key = signing_key.key
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=ALGORITHMS, audience=AUDIENCE, issuer=self.settings.jwt_issuer,
            options={"require": ["exp", "iss", "aud"]},
        )
        return claims


@dataclass(frozen=True)
class MnemoryContext:
    """What the surface keeps for the app's life, built whole by install()."""

    settings: MnemorySettings
    verifier: JwtVerifier
    local_sessions: InProcessMemorySessions


@dataclass(frozen=True)
class MnemoryCaller:
    principal: Principal
    agent_id: str | None  # X-Agent-Id, or the JWT's agent_id claim


def context_of(request: Request) -> MnemoryContext:
    context: MnemoryContext = request.app.state.mnemory
    return context


def _agent_header(request: Request) -> str | None:
    agent = (request.headers.get(AGENT_HEADER) or "").strip() or None
    if agent is not None and (len(agent) > MAX_ID_CHARS or "\x00" in agent):
        raise HTTPException(status_code=422, detail=f"X-Agent-Id: at most {MAX_ID_CHARS} characters")
    return agent


async def _jwt_caller(request: Request, token: str, agent: str | None) -> MnemoryCaller | None:
    context = context_of(request)
    if not context.verifier.enabled or token.count(".") != 2:
        return None
    try:
        claims = await anyio.to_thread.run_sync(context.verifier.claims, token)
    except InvalidTokenError as exc:
        logger.info("mnemory JWT refused: %s", exc)
        raise HTTPException(status_code=401, detail=f"Invalid token: {exc}", headers={"WWW-Authenticate": "Bearer"}) from None
    key_id = claims.get(context.settings.jwt_key_claim)
    if not isinstance(key_id, str) or not key_id.strip():
        raise HTTPException(status_code=401, detail=f"Invalid token: no {context.settings.jwt_key_claim} claim naming a key")
    claim_agent = claims.get("agent_id")
    if claim_agent is not None and not isinstance(claim_agent, str):
        raise HTTPException(status_code=401, detail="Invalid token: agent_id claim must be a string")
    if claim_agent and agent and claim_agent != agent:
        raise HTTPException(status_code=401, detail="X-Agent-Id does not match JWT agent_id claim")
    state = gateway_state(request)
    principal = await state.authenticator.principal_for_key(key_id)
    if principal is None or principal.is_master or principal.key_id is None:  # a token never stands for the master key
        raise HTTPException(status_code=401, detail="Invalid token: its key is unknown, inactive or deleted")
    # The front door meters a request per key only for the keys it resolves; a token's key is
    # known from here on, so it is counted in the same per-key window.
    allowed, retry = await state.limiter.hit("key", principal.key_id, state.settings.key_rate_limit_per_min)
    if not allowed:
        raise HTTPException(status_code=429, detail="Too Many Requests", headers={"Retry-After": str(retry)})
    return MnemoryCaller(principal, claim_agent or agent)


async def _caller(request: Request) -> MnemoryCaller:
    agent = _agent_header(request)
    principal = caller(request)
    token = bearer_token(request.headers.get("authorization"))
    presented = request.scope.get(TOKEN_SCOPE_KEY)
    if principal is not None and isinstance(presented, str) and presented.startswith(OAUTH_TOKEN_PREFIX):
        # OAuth access tokens are issued for the MCP resource ({base}/mcp), not this surface.
        raise HTTPException(status_code=401, detail="OAuth access tokens are for /mcp; use an API key or a JWT here",
                            headers={"WWW-Authenticate": "Bearer"})
    if principal is not None:
        return MnemoryCaller(principal, agent)
    found = await _jwt_caller(request, token, agent) if token else None
    if found is None:
        raise HTTPException(status_code=401, detail=_UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return found


async def reader(request: Request) -> MnemoryCaller:
    """FastAPI dependency of every read operation."""
    found = await _caller(request)
    if not has_permission(found.principal, "read"):
        raise HTTPException(status_code=403, detail="Forbidden: this key lacks the read permission")
    return found


async def writer(request: Request) -> MnemoryCaller:
    """FastAPI dependency of every write operation."""
    found = await _caller(request)
    if not has_permission(found.principal, "write"):
        raise HTTPException(status_code=403, detail="Forbidden: this key lacks the write permission")
    return found
