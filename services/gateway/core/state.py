"""The gateway's state: every client and service object, built once by the app's lifespan
and handed to whatever needs it. It hangs on the app under one attribute and is read through
`gateway_state()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import redis.asyncio as aioredis
from celery import Celery
from starlette.requests import HTTPConnection
from starlette.types import Scope

from services.common.rpc import InternalClient
from services.gateway.core.auth import Authenticator
from services.gateway.core.limits import RateLimiter
from services.gateway.core.usage import DailyCalls
from services.gateway.sessions import Sessions
from shared.settings import GatewaySettings

if TYPE_CHECKING:  # the surfaces are built on the core, not the other way round
    from services.gateway.mcp.transports import Transports
    from services.gateway.oauth.service import OAuthService

STATE_ATTRIBUTE = "gateway"


@dataclass(frozen=True)
class GatewayState:
    settings: GatewaySettings
    pool: asyncpg.Pool
    redis: aioredis.Redis | None
    celery: Celery | None  # the job broker (reflect, maintenance); None without one
    authenticator: Authenticator
    limiter: RateLimiter
    upstreams: InternalClient
    daily_calls: DailyCalls
    sessions: Sessions
    oauth: OAuthService
    mcp: Transports
    config: dict[str, Any]  # memory://config


def gateway_state(connection: HTTPConnection) -> GatewayState:
    return state_of(connection.scope)


def state_of(scope: Scope) -> GatewayState:
    """The state from an ASGI scope (the app sets scope["app"] before any middleware runs)."""
    state: GatewayState = getattr(scope["app"].state, STATE_ATTRIBUTE)
    return state


def started(scope: Scope) -> bool:
    """Whether the lifespan has built the state (a request can arrive before it has)."""
    return hasattr(scope["app"].state, STATE_ATTRIBUTE)
