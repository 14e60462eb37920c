"""Gateway: MCP Streamable HTTP, auth, health; forwards tool calls to recall / ingest."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.common.internal import install_observability
from services.gateway.admin_maintenance import router as admin_maintenance_router
from services.gateway.api import router
from services.gateway.auth import Authenticator, bearer_token
from services.gateway.mcp_server import PRINCIPAL_SCOPE_KEY, GatewayContext, build_mcp_server
from services.gateway.upstream import Upstreams
from shared.db import create_pool
from shared.settings import GatewaySettings
from shared.telemetry import configure_logging, configure_tracing

logger = logging.getLogger(__name__)
VERSION = "0.1.0"


def resource_metadata_url(scope: Scope) -> str:
    headers = Headers(scope=scope)
    host = headers.get("host", "localhost")
    scheme = headers.get("x-forwarded-proto", scope.get("scheme", "http"))
    return f"{scheme}://{host}/.well-known/oauth-protected-resource"


class BearerAuth:
    """Authenticates every request to the wrapped ASGI app and hands the Principal on in
    the ASGI scope; a missing or bad credential gets 401 with the RFC 9728 pointer."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = bearer_token(Headers(scope=scope).get("authorization"))
        principal = await self.authenticator.authenticate(token)
        if principal is None:
            response = JSONResponse(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Unauthorized"}},
                status_code=401,
                headers={"WWW-Authenticate": f'Bearer resource_metadata="{resource_metadata_url(scope)}"'},
            )
            await response(scope, receive, send)
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.app(scope, receive, send)


def _transport_security(settings: GatewaySettings) -> TransportSecuritySettings:
    if settings.allowed_hosts:
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=settings.allowed_hosts,
            allowed_origins=settings.allowed_origins,
        )
    if settings.host in ("127.0.0.1", "localhost", "::1"):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    # Behind an ingress the Host is the public name; list it in MCP_ALLOWED_HOSTS to check it.
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


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
    server = build_mcp_server(GatewayContext(upstreams=upstreams), VERSION)
    session_manager = StreamableHTTPSessionManager(
        app=server,
        security_settings=_transport_security(settings),
        max_request_body_size=settings.max_body_bytes,
    )
    state: dict[str, Any] = {}

    class _McpEndpoint:
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await state["mcp_app"](scope, receive, send)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(settings.database_url, min_size=1, max_size=settings.db_pool_max)
        redis_client = (
            aioredis.Redis.from_url(settings.redis_url, socket_connect_timeout=1, socket_timeout=1)
            if settings.redis_active
            else None
        )
        authenticator = Authenticator(settings.access_key, pool)
        state["mcp_app"] = BearerAuth(session_manager.handle_request, authenticator)
        app.state.settings = settings
        app.state.pool = pool
        app.state.redis = redis_client
        app.state.upstreams = upstreams
        app.state.authenticator = authenticator
        app.state.session_manager = session_manager
        try:
            async with session_manager.run():
                yield
        finally:
            await upstreams.aclose()
            if redis_client is not None:
                await redis_client.aclose()
            await pool.close()

    app = FastAPI(title="Engram", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.router.routes.append(Route("/mcp", endpoint=_McpEndpoint(), methods=["GET", "POST", "DELETE"]))
    app.include_router(router)
    app.include_router(admin_maintenance_router)
    install_observability(app, "gateway")
    return app
