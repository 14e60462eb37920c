"""Artifact writes (reference 004): save and delete, and the purge of stored objects whose
rows are gone. Internal tools behind the gateway's /api/memories/{id}/artifacts routes.

A refusal is a tool error whose result carries the HTTP `status` the REST surface answers
(404 memory / artifact not found, 413 too large, 422 bad content, 503 storage down).
Bytes cross the internal hop base64-encoded in the JSON body: ARTIFACT_MAX_BYTES (512 KiB by
default) keeps that hop small, and the gateway never holds storage credentials."""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

import anyio
import asyncpg
from fastapi import Request
from pydantic import Field

from services.common.internal import ToolContext, parse_arguments
from services.ingest.service import WriteResources
from shared.artifacts import content as artifact_content
from shared.artifacts.storage import StorageUnavailable, storage_key, storages_for
from shared.contract.base import Id, ToolArgs
from shared.domain.secrets import screen_value
from shared.repositories import artifacts as artifacts_repo

logger = logging.getLogger(__name__)

ToolResult = tuple[dict[str, Any], bool]
MEMORY_NOT_FOUND = "Memory not found"
ARTIFACT_NOT_FOUND = "Artifact not found"
# Objects deleted per purge transaction; a forget of one memory queues a handful.
PURGE_BATCH = 200


class ArtifactSaveArgs(ToolArgs):
    memory_id: Id
    # Bounded again by ARTIFACT_MAX_BYTES once decoded; this only stops absurd bodies early.
    content: str = Field(max_length=64 * 1024 * 1024)
    filename: str = Field(artifact_content.DEFAULT_FILENAME, max_length=1000)
    content_type: str = Field(artifact_content.DEFAULT_CONTENT_TYPE, max_length=255)


class ArtifactRef(ToolArgs):
    memory_id: Id
    artifact_id: Id


def refusal(status: int, detail: str) -> ToolResult:
    return {"status": status, "detail": detail}, True


def new_artifact_id() -> str:
    return f"art-{secrets.token_hex(8)}"


async def save(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    res: WriteResources = request.app.state.resources
    args: ArtifactSaveArgs = parse_arguments(ArtifactSaveArgs, arguments)
    settings = res.settings
    try:
        content_type = artifact_content.check_content_type(args.content_type)
        filename = artifact_content.clean_filename(args.filename)
        data = artifact_content.decode(args.content, content_type)
    except artifact_content.ContentError as exc:
        return refusal(422, str(exc))
    if len(data) > settings.artifact_max_bytes:
        return refusal(413, f"Artifact too large: {len(data)} bytes (max {settings.artifact_max_bytes})")
    # The same secret policy as every write (shared/domain/secrets.py): text is screened,
    # refused (-32602 naming the field) or redacted; binary bytes cannot be read as text.
    redacted: list[str] = []
    filename = screen_value("filename", filename, settings.secret_policy, redacted)
    if artifact_content.is_text(content_type):
        text = screen_value("content", args.content, settings.secret_policy, redacted)
        data = text.encode("utf-8")

    principal = ctx.principal
    async with res.pool.acquire() as conn:
        found, tenant = await artifacts_repo.fragment_tenant(conn, principal.writes, args.memory_id)
    if not found:
        return refusal(404, MEMORY_NOT_FOUND)
    storages = storages_for(settings)
    storage = storages.current
    artifact_id = new_artifact_id()
    key = storage_key(tenant, args.memory_id, artifact_id)
    try:
        await anyio.to_thread.run_sync(storage.put, key, data, content_type)
    except StorageUnavailable as exc:
        logger.warning("artifact save: storage unavailable (%s)", exc)
        return refusal(503, "Artifact storage unavailable")
    # The object is written first, then the row, under a lock on the memory: a memory deleted
    # meanwhile leaves no row, and the object written for it is deleted here.
    async with res.pool.acquire() as conn, conn.transaction():
        found, _ = await artifacts_repo.fragment_tenant(conn, principal.writes, args.memory_id, lock=True)
        row = None
        if found:
            row = await artifacts_repo.insert(
                conn, artifact_id=artifact_id, fragment_id=args.memory_id, key_id=tenant, filename=filename,
                content_type=content_type, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                backend=storage.backend, storage_key=key,
            )
    if row is None:
        await _delete_object(storage.backend, key, res)
        return refusal(404, MEMORY_NOT_FOUND)
    # Objects of memories deleted by any path (a key's removal cascades too) go here as well.
    await purge_after_forget(res)
    result = row.metadata()
    if redacted:
        result["secrets_redacted"] = redacted
    return result, False


async def delete(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    res: WriteResources = request.app.state.resources
    args: ArtifactRef = parse_arguments(ArtifactRef, arguments)
    async with res.pool.acquire() as conn, conn.transaction():
        found, _ = await artifacts_repo.fragment_tenant(conn, ctx.principal.writes, args.memory_id)
        if not found:
            return refusal(404, MEMORY_NOT_FOUND)
        deleted = await artifacts_repo.delete(conn, ctx.principal.writes, args.memory_id, args.artifact_id)
    if not deleted:
        return refusal(404, ARTIFACT_NOT_FOUND)
    await purge(res)
    return {"deleted": True, "id": args.artifact_id, "memory_id": args.memory_id}, False


async def purge(res: WriteResources) -> int:
    """Delete the stored objects the purge queue holds (rows deleted with their memory or one
    by one). Runs right after a forget or an artifact delete has committed; what storage
    refuses now stays queued for the next purge. Returns the objects deleted."""
    storages = storages_for(res.settings)
    done = 0
    while True:
        async with res.pool.acquire() as conn, conn.transaction():
            batch = await artifacts_repo.take_purge_batch(conn, PURGE_BATCH)
            if not batch:
                return done
            deleted: list[tuple[str, str]] = []
            for backend, key in batch:
                try:
                    await anyio.to_thread.run_sync(storages.named(backend).delete, key)
                except StorageUnavailable as exc:
                    logger.warning("artifact purge: %s (%s); it stays queued", key, exc)
                    continue
                deleted.append((backend, key))
            await artifacts_repo.purged(conn, deleted)
        done += len(deleted)
        if len(deleted) < len(batch):  # storage refuses: try again on the next purge
            return done


async def purge_after_forget(res: WriteResources) -> None:
    """The purge after a committed write (forget, an artifact save): the write is reported
    whatever happens here."""
    try:
        purged = await purge(res)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        logger.warning("artifact purge failed; the objects stay queued", exc_info=True)
        return
    if purged:
        logger.info("purged %d artifact object(s)", purged)


async def _delete_object(backend: str, key: str, res: WriteResources) -> None:
    try:
        await anyio.to_thread.run_sync(storages_for(res.settings).named(backend).delete, key)
    except StorageUnavailable:
        logger.warning("artifact %s: its memory went away during the save and the object could not be deleted", key)


TOOL_HANDLERS: dict[str, Any] = {"artifact_save": save, "artifact_delete": delete}
