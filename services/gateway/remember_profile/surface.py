"""Serving the remember profile: Streamable HTTP at /mcp/remember-profile through the MCP SDK's
transport, stateless (every request stands alone: the profile has no session-bound tool, so
any gateway replica serves any request and nothing is kept between them), with the Host /
Origin checks of /mcp (mcp/transports.py). The caller is the one the front door resolved
(Authorization: Bearer <key>); without one the endpoint answers 401 like /mcp."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services.gateway.core.scope import PRINCIPAL_SCOPE_KEY
from services.gateway.core.state import state_of
from services.gateway.core.wire import unauthorized
from services.gateway.mcp.transports import transport_security
from services.gateway.remember_profile.handler import RememberProfileHandler

PROFILE_PATH = "/mcp/remember-profile"
_ATTRIBUTE = "remember_profile"


class _Endpoint:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get(PRINCIPAL_SCOPE_KEY) is None:
            await unauthorized(scope)(scope, receive, send)
            return
        manager: StreamableHTTPSessionManager = getattr(scope["app"].state, _ATTRIBUTE)
        await manager.handle_request(scope, receive, send)


def install(app: FastAPI, version: str) -> None:
    """Route /mcp/remember-profile, and run its transport for as long as the app's lifespan
    (after the lifespan has built the gateway state the profile forwards through)."""
    app.router.routes.append(Route(PROFILE_PATH, endpoint=_Endpoint(), methods=["GET", "POST", "DELETE"]))
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: FastAPI) -> AsyncIterator[None]:
        async with inner(application):
            state = state_of({"app": application})
            manager = StreamableHTTPSessionManager(
                app=RememberProfileHandler(state).server(version),
                security_settings=transport_security(state.settings),
                max_request_body_size=state.settings.max_body_bytes,
                stateless=True,
                json_response=True,
            )
            setattr(application.state, _ATTRIBUTE, manager)
            async with manager.run():
                yield

    app.router.lifespan_context = lifespan
