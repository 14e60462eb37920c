"""Which Postgres node serves each recall tool call (shared/read_routing.py decides how).

Recall's tools read, so each call is served by a usable replica that has replayed the
caller's last write, else by the primary. The tools that write stay on the primary and then
record their write position, like ingest's. A call a replica fails (it died, restarts,
cancelled the query, or the call turned out to write) is served again by the primary: the
caller never sees the replica's error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request

from services.common.internal import ToolContext
from shared.read_routing import REPLICA_FAILURES, ReadRouter

logger = logging.getLogger(__name__)

ToolResult = tuple[dict[str, Any], bool]
Handler = Callable[[Request, ToolContext, dict[str, Any]], Awaitable[ToolResult]]

# Recall's tools that write in the request (tool_feedback: its feedback row and activation).
# The effects queue's writes (access counts, search events) are the drainer's, on the primary.
PRIMARY_ONLY = frozenset({"tool_feedback"})


def route_reads(handlers: dict[str, Handler]) -> dict[str, Handler]:
    return {name: (_on_primary(h) if name in PRIMARY_ONLY else _on_replica(h)) for name, h in handlers.items()}


def _router(request: Request) -> ReadRouter:
    router: ReadRouter = request.app.state.read_router
    return router


def _on_primary(handler: Handler) -> Handler:
    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        router = _router(request)
        result = await handler(request, ctx, arguments)
        await router.record_write(ctx.principal)
        return result

    return handle


def _on_replica(handler: Handler) -> Handler:
    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        router = _router(request)
        if not router.enabled:
            return await handler(request, ctx, arguments)
        replica = await router.choose(ctx.principal)
        if replica is not None:
            try:
                with router.reading_from(replica):
                    return await handler(request, ctx, arguments)
            except REPLICA_FAILURES as exc:
                logger.warning("read replica %s failed a call (%s); serving it from the primary", replica.label, exc.__class__.__name__)
                await router.failed(replica, exc)
        with router.reading_from(None):
            return await handler(request, ctx, arguments)

    return handle
