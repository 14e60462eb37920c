"""Ingest routes: health, and the tool handlers behind POST /v1/tools/{name}."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request

from services.common.handlers import joined
from services.common.internal import ToolContext, database_health
from services.ingest import amend as amend_tool
from services.ingest import batch as batch_tool
from services.ingest import forget as forget_tool
from services.ingest import link as link_tool
from services.ingest import reflect as reflect_tool
from services.ingest import remember as remember_tool
from services.ingest import remember_profile as remember_profile_tool
from services.ingest import transfer as transfer_tool
from services.ingest.admin_tools import TOOL_HANDLERS as ADMIN_TOOL_HANDLERS
from services.ingest.artifacts import TOOL_HANDLERS as ARTIFACT_TOOL_HANDLERS
from services.ingest.memory_handlers import MEMORY_TOOL_HANDLERS
from services.ingest.mnemory_api import TOOL_HANDLERS as MNEMORY_TOOL_HANDLERS
from services.ingest.service import WriteResources, after_commit, invalidate_recall_cache
from shared.jobs import JobBuffer
from shared.read_routing import record_write_position

ToolResult = tuple[dict[str, Any], bool]
Handler = Callable[[Request, ToolContext, dict[str, Any]], Awaitable[ToolResult]]
WriteTool = Callable[[WriteResources, JobBuffer, ToolContext, dict[str, Any]], Awaitable[ToolResult]]
PlainTool = Callable[[WriteResources, ToolContext, dict[str, Any]], Awaitable[ToolResult]]

router = APIRouter()
router.add_api_route("/health", database_health("ingest"), methods=["GET"])


def _wrote(result: ToolResult, arguments: dict[str, Any]) -> bool:
    return not result[1] and not arguments.get("dryRun") and not result[0].get("async")


async def _committed(res: WriteResources, ctx: ToolContext, result: ToolResult, stale: bool) -> None:
    """After a write call: where the primary's WAL stands, stored under the calling key for
    read-your-writes on recall's read replicas (shared/read_routing.py; a refused call wrote
    nothing, so no round trip for it), and, if it wrote, the recall cache it may have made
    stale invalidated. Both before the reply, at once: a Postgres and a Redis round trip, and
    neither needs the other (each logs its own failure and goes on)."""
    steps = []
    if not result[1]:
        steps.append(record_write_position(res.pool, res.redis, ctx.principal))
    if stale:
        steps.append(invalidate_recall_cache(res, ctx.principal))
    await asyncio.gather(*steps)


def _with_jobs(tool: WriteTool) -> Handler:
    """Run a write tool with a job buffer that is flushed only after it has committed, then
    _committed's bookkeeping."""

    async def handler(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        res = request.app.state.resources
        jobs = res.job_buffer()
        result = await tool(res, jobs, ctx, arguments)
        await after_commit(res, jobs)
        await _committed(res, ctx, result, _wrote(result, arguments))
        return result

    return handler


def _plain(tool: PlainTool, writes: bool = False) -> Handler:
    """A tool without jobs; a writing one gets _committed's bookkeeping."""

    async def handler(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        res = request.app.state.resources
        result = await tool(res, ctx, arguments)
        if writes:
            await _committed(res, ctx, result, _wrote(result, arguments))
        return result

    return handler


# Built here: each records its own write position (_committed).
_OWN_HANDLERS = {
    "remember": _with_jobs(remember_tool.remember),
    # The remember profile's write (reference 003; services/gateway/remember_profile/).
    "profile_remember": _with_jobs(remember_profile_tool.remember),
    "batch_remember": _with_jobs(batch_tool.batch_remember),
    "batch_status": _plain(batch_tool.batch_status),  # a read: nothing for a replica to catch up on
    "forget": _plain(forget_tool.forget, writes=True),
    "amend": _with_jobs(amend_tool.amend),
    "link": _with_jobs(link_tool.link),
    "reflect": _with_jobs(reflect_tool.reflect),
    # Served for the gateway's admin import route only (master key; never an MCP tool).
    "admin_import": _with_jobs(transfer_tool.import_fragments),
}


def _recording_write_position(handler: Handler) -> Handler:
    """Read-your-writes on recall's read replicas (shared/read_routing.py) for the other
    modules' writes: _committed's write position after the call. The recall cache is theirs
    to invalidate where a write changes what recall returns: the memory REST APIs do in their
    own handlers, memory_consolidate's cycle does in the worker when it has run."""

    async def recorded(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        result = await handler(request, ctx, arguments)
        await _committed(request.app.state.resources, ctx, result, stale=False)
        return result

    return recorded


_OTHER_WRITES = joined(
    ADMIN_TOOL_HANDLERS,
    # Served for the gateway's /api/memories/{id}/artifacts routes (reference 004).
    ARTIFACT_TOOL_HANDLERS,
    # The mnemory REST surface's writes (reference 004; services/gateway/mnemory_api/).
    MNEMORY_TOOL_HANDLERS,
    # The memory REST API of reference 001 (services/gateway/memory_api/).
    MEMORY_TOOL_HANDLERS,
)
tool_handlers = joined(_OWN_HANDLERS, {name: _recording_write_position(h) for name, h in _OTHER_WRITES.items()})
