"""Gateway: MCP (Streamable HTTP + legacy SSE), auth, limits, admin REST, OAuth, health;
forwards tool calls to recall / ingest."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services.common.heap import settle_heap
from services.common.internal import install_observability
from services.gateway import openapi
from services.gateway.admin import io as admin_io
from services.gateway.admin import keys as admin_keys
from services.gateway.admin.maintenance import router as admin_maintenance_router
from services.gateway.api import router
from services.gateway.core.auth import Authenticator
from services.gateway.core.edge import GatewayEdge
from services.gateway.core.jsonrpc_guard import JsonRpcGuard
from services.gateway.core.limits import RateLimiter
from services.gateway.core.upstream import Upstreams
from services.gateway.core.usage import DailyCalls
from services.gateway.mcp import rotation
from services.gateway.mcp.modes import MODES
from services.gateway.mcp.server import GatewayContext, build_mcp_server
from services.gateway.mcp.transports import Transports
from services.gateway.oauth.service import OAuthService, install_oauth
from services.gateway.sessions.registry import GatewaySession, SessionRegistry
from shared.db import create_pool
from shared.jobs import celery_client
from shared.settings import GatewaySettings
from shared.telemetry import configure_logging, configure_tracing

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
    """An ASGI route target resolved at request time (the transports exist per app)."""

    def __init__(self, handler_name: str, holder: dict[str, Transports]) -> None:
        self.handler_name = handler_name
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await getattr(self.holder["transports"], self.handler_name)(scope, receive, send)


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    settings.check_secure()
    configure_logging(settings.log_level)
    configure_tracing(settings.otel_service_name or "engram-gateway", console=settings.otel_console)

    upstreams = Upstreams(
        [u.strip() for u in settings.recall_url.split(",") if u.strip()],
        settings.ingest_url,
        settings.service_token,
        settings.upstream_timeout.total_seconds(),
    )
    gw = GatewayContext(upstreams=upstreams, config=public_config(settings))
    server = build_mcp_server(gw, VERSION)
    transports = Transports(server, settings)
    holder = {"transports": transports}

    async def rotate_session(session: GatewaySession, presented_id: str, reason: str) -> dict[str, object]:
        return await rotation.rotate(transports, session, presented_id, reason)

    gw.rotate = rotate_session

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(settings.database_url, min_size=1, max_size=settings.db_pool_max)
        redis_client = (
            aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=1, socket_timeout=1)
            if settings.redis_active
            else None
        )
        broker = settings.broker_url or (settings.redis_url if settings.redis_active else None)
        celery = celery_client(broker) if broker else None
        authenticator = Authenticator(settings.access_key, pool, redis_client)
        daily_calls = DailyCalls(pool, redis_client)
        registry = SessionRegistry(settings, pool, celery)
        registry.on_handover = transports.end_transport
        transports.registry = registry
        gw.pool = pool
        gw.registry = registry
        gw.daily_calls = daily_calls
        app.state.settings = settings
        app.state.pool = pool
        app.state.redis = redis_client
        app.state.upstreams = upstreams
        app.state.authenticator = authenticator
        app.state.session_manager = transports.streamable
        app.state.transports = transports
        app.state.registry = registry
        app.state.daily_calls = daily_calls
        app.state.oauth = OAuthService(pool, settings, authenticator)
        app.state.limiter = RateLimiter(redis_client)
        settle_heap()
        try:
            async with transports.streamable.run():
                yield
        finally:
            await registry.aclose()
            await daily_calls.aclose()
            await upstreams.aclose()
            if redis_client is not None:
                await redis_client.aclose()
            await pool.close()

    app = FastAPI(
        title="Engram", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
        # The server span and HTTP metrics come from install_observability; FastAPI's own
        # would be a second span and histogram per request (CPU on every tool call).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.router.routes.append(Route("/mcp", endpoint=_Endpoint("mcp", holder), methods=["GET", "POST", "DELETE"]))
    app.router.routes.append(Route("/sse", endpoint=_Endpoint("sse_connect", holder), methods=["GET"]))
    app.router.routes.append(Route("/message", endpoint=_Endpoint("sse_message", holder), methods=["POST"]))
    app.include_router(router)
    app.include_router(rotation.router)
    app.include_router(admin_keys.auth_router)
    app.include_router(admin_keys.router)
    app.include_router(admin_maintenance_router)
    app.include_router(admin_io.router)
    install_oauth(app)
    openapi.install(app)
    # Inside the observability middleware, so refusals (413, 429) are counted too.
    app.add_middleware(JsonRpcGuard)  # inside the edge: after the body limit and the credential
    app.add_middleware(GatewayEdge, state=app.state)
    install_observability(app, "gateway")
    return app
