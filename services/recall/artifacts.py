"""Artifact reads (reference 004): list a memory's artifacts, read one (text paged by
characters, binary whole as base64), and its raw bytes for the gateway's /raw route.
Internal tools behind /api/memories/{id}/artifacts; a refusal is a tool error carrying the
HTTP `status` the REST surface answers."""

from __future__ import annotations

import base64
import logging
from typing import Any

import anyio
from fastapi import Request
from pydantic import Field

from services.common.internal import ToolContext, parse_arguments
from shared.artifacts import content as artifact_content
from shared.artifacts.storage import ArtifactMissing, StorageUnavailable, storages_for
from shared.contract.base import Id, ToolArgs
from shared.repositories import artifacts as artifacts_repo
from shared.repositories.artifacts import ArtifactRow

logger = logging.getLogger(__name__)

ToolResult = tuple[dict[str, Any], bool]


class ArtifactListArgs(ToolArgs):
    memory_id: Id


class ArtifactReadArgs(ToolArgs):
    memory_id: Id
    artifact_id: Id
    offset: int = Field(0, ge=0, le=2**31)
    limit: int = Field(artifact_content.DEFAULT_READ_LIMIT, ge=1, le=2**31)
    # raw: the whole object base64 (the gateway's /raw and download-token routes).
    raw: bool = False
    # meta_only: the metadata without reading storage (the download-token route).
    meta_only: bool = False


def refusal(status: int, detail: str) -> ToolResult:
    return {"status": status, "detail": detail}, True


async def list_artifacts(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args: ArtifactListArgs = parse_arguments(ArtifactListArgs, arguments)
    pool = request.app.state.resources.pool
    async with pool.acquire() as conn:
        found, _ = await artifacts_repo.fragment_tenant(conn, ctx.principal.reads, args.memory_id)
        if not found:
            return refusal(404, "Memory not found")
        rows = await artifacts_repo.list_for(conn, ctx.principal.reads, args.memory_id)
    return {"artifacts": [r.metadata() for r in rows]}, False


async def read_artifact(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args: ArtifactReadArgs = parse_arguments(ArtifactReadArgs, arguments)
    res = request.app.state.resources
    async with res.pool.acquire() as conn:
        row = await artifacts_repo.get(conn, ctx.principal.reads, args.memory_id, args.artifact_id)
    if row is None:
        return refusal(404, "Artifact not found")
    meta = row.metadata()
    if args.meta_only:
        return meta, False
    try:
        data = await _load(row, res.settings)
    except ArtifactMissing:
        logger.error("artifact %s: its row exists but storage has no object %s", row.id, row.storage_key)
        return refusal(404, "Artifact not found")
    except StorageUnavailable as exc:
        logger.warning("artifact read: storage unavailable (%s)", exc)
        return refusal(503, "Artifact storage unavailable")
    if args.raw:
        return {**meta, "content": base64.b64encode(data).decode("ascii")}, False
    page = artifact_content.read_page(data, row.content_type, args.offset, args.limit)
    return {**page, "content_type": row.content_type, "filename": row.filename}, False


async def _load(row: ArtifactRow, settings: Any) -> bytes:
    storage = storages_for(settings).named(row.backend)
    data: bytes = await anyio.to_thread.run_sync(storage.get, row.storage_key)
    return data


TOOL_HANDLERS: dict[str, Any] = {"artifact_list": list_artifacts, "artifact_read": read_artifact}
