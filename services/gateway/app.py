"""Gateway: MCP (Streamable HTTP + legacy SSE), auth, limits, admin REST, OAuth, health;
forwards tool calls to recall / ingest."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.heap import settle_heap
from services.common.internal import install_observability
from services.common.rpc import InternalClient
from services.gateway import openapi
from services.gateway.admin import console as admin_console
from services.gateway.admin import io as admin_io
from services.gateway.admin import keys as admin_keys
from services.gateway.admin import logs as admin_logs
from services.gateway.admin import memory as admin_memory
from services.gateway.admin import operations as admin_operations
from services.gateway.admin import sessions as admin_sessions
from services.gateway.admin import stats as admin_stats
from services.gateway.admin.maintenance import router as admin_maintenance_router
from services.gateway.api import router
from services.gateway.core.auth import Authenticator
from services.gateway.core.edge import GatewayEdge
from services.gateway.core.jsonrpc_guard import JsonRpcGuard
from services.gateway.core.limits import RateLimiter
from services.gateway.core.state import STATE_ATTRIBUTE, GatewayState, state_of
from services.gateway.core.usage import DailyCalls
from services.gateway.mcp import rotation
from services.gateway.mcp.modes import MODES
from services.gateway.mcp.server import McpHandler
from services.gateway.mcp.transports import Transports
from services.gateway.memory_api import events as memory_events_api
from services.gateway.memory_api import routes as memory_api_routes
from services.gateway.mnemory_api import artifacts as mnemory_artifacts
from services.gateway.mnemory_api import install as install_mnemory_api
from services.gateway.oauth.service import OAuthService, install_oauth
from services.gateway.remember_profile import install as install_remember_profile
from services.gateway.sessions import (
    FallbackSessionStore,
    MemorySessionStore,
    RedisSessionStore,
    Sessions,
    SessionStore,
)
from shared.db import create_pool
from shared.jobs import celery_client
from shared.redis_breaker import request_path_redis
from shared.settings import GatewaySettings
from shared.telemetry import configure_telemetry

logger = logging.getLogger(__name__)
VERSION = "0.1.0"


def public_config(settings: GatewaySettings) -> dict[str, object]:
    """memory://config: the limits and thresholds a client can plan around."""
    return {
        "version": VERSION,
        "modes": list(MODES),
        "sessionSegment": {
            "enabled": settings.session_segment,
            "idleSeconds": settings.segment_idle.total_seconds(),
            "lifetimeSeconds": settings.segment_lifetime.total_seconds(),
        },
        "limits": {
            "maxBodyBytes": settings.max_body_bytes,
            "rotatePerMinutePerIp": settings.rotate_rate_limit_per_min,
            "requestsPerMinutePerIp": settings.ip_rate_limit_per_min,
            "requestsPerMinutePerKey": settings.key_rate_limit_per_min,
            "rememberMaxContent": 4000,
            "batchRememberMax": 200,
            "recallPageSizeMax": 50,
            "recallTokenBudgetDefault": 1000,
        },
    }


class _Endpoint:
    """An ASGI route target on the MCP transports, which the lifespan builds."""

    def __init__(self, handler: Callable[[Transports], ASGIApp]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(state_of(scope).mcp)(scope, receive, send)


async def build_state(settings: GatewaySettings) -> GatewayState:
    """Every client and service object of the gateway, built once, each handed what it needs."""
    pool = await create_pool(settings.database_url, min_size=1, max_size=settings.db_pool_max)
    redis_client = (
        request_path_redis(settings.redis_url, settings)
        if settings.redis_active
        else None
    )
    broker = settings.broker_url or (settings.redis_url if settings.redis_active else None)
    celery = celery_client(broker) if broker else None
    upstreams = InternalClient(
        {"recall": InternalClient.replicas(settings.recall_url), "ingest": InternalClient.replicas(settings.ingest_url)},
        settings.service_token,
        settings.upstream_timeout.total_seconds(),
    )
    authenticator = Authenticator(settings.access_key, pool, redis_client)
    daily_calls = DailyCalls(pool, redis_client)
    # Without Redis the sessions live in this process: one replica only (README).
    store: SessionStore = (
        FallbackSessionStore(RedisSessionStore(redis_client), MemorySessionStore())
        if redis_client is not None
        else MemorySessionStore()
    )
    sessions = Sessions(settings, store, pool, celery)
    config = public_config(settings)
    handler = McpHandler(sessions, upstreams, daily_calls, pool, config)
    return GatewayState(
        settings=settings, pool=pool, redis=redis_client, celery=celery, authenticator=authenticator,
        limiter=RateLimiter(redis_client), upstreams=upstreams, daily_calls=daily_calls, sessions=sessions,
        oauth=OAuthService(pool, settings, authenticator), mcp=Transports(handler.server(VERSION), settings, sessions),
        config=config,
    )


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    settings.check_secure()
    configure_telemetry(settings, "engram-gateway")
    # mcp 2.3.0 logs "Terminating session: None" at INFO for every stateless request.
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await build_state(settings)
        setattr(app.state, STATE_ATTRIBUTE, state)
        settle_heap()
        try:
            async with state.mcp.running(), state.sessions.running(), memory_events_api.running(app, settings):
                yield
        finally:
            await state.mcp.aclose()
            await state.daily_calls.aclose()
            await state.upstreams.aclose()
            if state.redis is not None:
                await state.redis.aclose()
            await state.pool.close()

    app = FastAPI(
        title="Engram", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
        # The server span and HTTP metrics come from install_observability; FastAPI's own
        # would be a second span and histogram per request (CPU on every tool call).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.router.routes.append(Route("/mcp", endpoint=_Endpoint(lambda t: t.mcp), methods=["GET", "POST", "DELETE"]))
    app.router.routes.append(Route("/sse", endpoint=_Endpoint(lambda t: t.sse_connect), methods=["GET"]))
    app.router.routes.append(Route("/message", endpoint=_Endpoint(lambda t: t.sse_message), methods=["POST"]))
    app.include_router(router)
    app.include_router(rotation.router)
    app.include_router(admin_keys.auth_router)
    app.include_router(admin_keys.router)
    app.include_router(admin_maintenance_router)
    app.include_router(admin_io.router)
    app.include_router(memory_events_api.router)
    app.include_router(memory_api_routes.router)  # reference 001's memory REST API
    for admin_views in (admin_stats, admin_memory, admin_sessions, admin_logs, admin_operations):
        app.include_router(admin_views.router)
    app.include_router(admin_console.router)
    app.include_router(mnemory_artifacts.router)
    install_mnemory_api(app, VERSION)
    install_remember_profile(app, VERSION)
    install_oauth(app)
    openapi.install(app)
    # Inside the observability middleware, so refusals (413, 429) are counted too.
    app.add_middleware(JsonRpcGuard)  # inside the edge: after the body limit and the credential
    app.add_middleware(GatewayEdge)
    install_observability(app, "gateway", lambda app: getattr(app.state, STATE_ATTRIBUTE, None))
    return app
