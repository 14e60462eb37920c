"""remember and batch_remember."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from pydantic import ValidationError

from services.common.internal import ToolContext, parse_arguments
from shared.contract.write import BatchRememberArgs, RememberArgs
from services.ingest.service import (
    CONFLICT_SIMILARITY,
    TOO_SHORT,
    WriteResources,
    build_fragment,
    check_quota,
    embedding_text,
)
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams
from shared.domain.principal import Principal, SqlParams, read_scope, write_scope
from shared.domain.search import FragmentFilter
from shared.jobs import JobBuffer
from shared.repositories import fragments as fragments_repo
from shared.repositories import links as links_repo

logger = logging.getLogger(__name__)

QUOTA_EXCEEDED = "fragment_limit_exceeded"


async def _lock_quota(conn: asyncpg.Connection, principal: Principal, adding: int) -> dict[str, int] | None:
    """Quota check under a row lock on the key, so concurrent writers cannot overshoot.

    (The reference makes this atomic only with MEMENTO_REMEMBER_ATOMIC=true; Engram always
    does, since the lock is one indexed row.)"""
    if principal.key_id is None or principal.fragment_limit is None:
        return None
    await conn.execute("SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE", principal.key_id)
    return await check_quota(conn, principal, adding)


async def _conflicts(conn: asyncpg.Connection, principal: Principal, f: frag.NewFragment) -> list[dict[str, Any]]:
    flt = FragmentFilter(workspace=f.workspace, topic=f.topic)
    near = await fragments_repo.vector_candidates(conn, principal, flt, f.embedding, 3)
    hits = [(fid, sim) for fid, sim in near if sim >= CONFLICT_SIMILARITY]
    rows = await fragments_repo.fetch_by_ids(conn, principal, [fid for fid, _ in hits])
    return [
        {"id": fid, "content": rows[fid]["content"], "similarity": round(sim, 4)} for fid, sim in hits if fid in rows
    ]


async def _supersede(conn: asyncpg.Connection, principal: Principal, new_id: str, targets: list[str]) -> list[str]:
    params = SqlParams()
    ids = params.add(targets)
    new = params.add(new_id)
    rows = await conn.fetch(
        f"""
        UPDATE fragments f SET valid_to = now(), importance = f.importance / 2, superseded_by = {new}, updated_at = now()
        WHERE f.id = ANY({ids}::text[]) AND f.valid_to IS NULL AND {write_scope(principal, params)}
        RETURNING f.id
        """,
        *params.values,
    )
    done = [r["id"] for r in rows]
    for old in done:
        await links_repo.insert_link(conn, old, new_id, "superseded_by", 1.0, principal.key_id)
    return done


async def _link_to(conn: asyncpg.Connection, principal: Principal, new_id: str, targets: list[str]) -> list[str]:
    params = SqlParams()
    rows = await conn.fetch(
        f"SELECT f.id FROM fragments f WHERE f.id = ANY({params.add(targets)}::text[]) AND {read_scope(principal, params)}",
        *params.values,
    )
    linked = [r["id"] for r in rows if r["id"] != new_id]
    for target in linked:
        await links_repo.insert_link(conn, new_id, target, "related", 1.0, principal.key_id)
    return linked


async def remember(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(RememberArgs, arguments)
    f = build_fragment(args, ctx)
    principal = ctx.principal
    warnings: list[str] = []
    if principal.allowed_workspaces is not None and f.workspace not in principal.allowed_workspaces:
        warnings.append("workspaceNotAllowed")

    async with res.pool.acquire() as conn:
        if args.idempotencyKey:
            existing = await conn.fetchval(
                "SELECT fragment_id FROM idempotency_records WHERE key_id = $1 AND idempotency_key = $2",
                principal.key_id or "", args.idempotencyKey,
            )
            if existing:
                return {"success": True, "id": existing, "idempotent": True}, False
        f.embedding = (await res.embed([embedding_text(f)]))[0]

        if args.dryRun:
            quota = await check_quota(conn, principal, 1)
            simulated = {
                "fragment": {"content": f.content, "type": f.type, "topic": f.topic, "keywords": f.keywords,
                             "workspace": f.workspace, "importance": f.importance},
                "conflicts": await _conflicts(conn, principal, f),
                "validation_warnings": warnings,
                "quota": quota,
            }
            return {"dryRun": True, "simulated": simulated}, False

        async with conn.transaction():
            quota = await _lock_quota(conn, principal, 1)
            if quota is not None and quota["remaining"] < 0:
                return {"success": False, "error": QUOTA_EXCEEDED, "quota": quota}, True
            if args.idempotencyKey:
                claimed = await conn.fetchval(
                    """
                    INSERT INTO idempotency_records (key_id, idempotency_key, fragment_id) VALUES ($1, $2, $3)
                    ON CONFLICT DO NOTHING RETURNING fragment_id
                    """,
                    principal.key_id or "", args.idempotencyKey, f.id,
                )
                if claimed is None:  # a concurrent retry won the race
                    existing = await conn.fetchval(
                        "SELECT fragment_id FROM idempotency_records WHERE key_id = $1 AND idempotency_key = $2",
                        principal.key_id or "", args.idempotencyKey,
                    )
                    return {"success": True, "id": existing, "idempotent": True}, False
            conflicts = await _conflicts(conn, principal, f)
            await fragments_repo.insert_many(conn, [f])
            superseded = await _supersede(conn, principal, f.id, args.supersedes) if args.supersedes else []
            linked = await _link_to(conn, principal, f.id, args.linkedTo) if args.linkedTo else []
            jobs.add("maintenance.link_new_fragments", fragment_ids=[f.id])

    result: dict[str, Any] = {
        "success": True,
        "id": f.id,
        "keywords": f.keywords,
        "ttl_tier": f.ttl_tier,
        "scope": f.scope,
        "conflicts": conflicts,
    }
    if superseded:
        result["superseded"] = superseded
    if linked:
        result["linked"] = linked
    if warnings:
        result["validation_warnings"] = warnings
    if quota is not None:
        result["quota"] = {**quota, "used": quota["used"] + 1}
    return result, False


def _validate_item(item: Any) -> str | None:
    """seed: the per-item pre-validation messages of batch_remember, exactly."""
    if not isinstance(item, dict):
        return "content is required"
    content = item.get("content")
    if content is None:
        return "content is required"
    if not isinstance(content, str):
        return "content must be a string"
    if len(content) > frag.MAX_CONTENT_CHARS:
        return f"content length {len(content)} exceeds max {frag.MAX_CONTENT_CHARS}"
    if not item.get("type"):
        return "type is required"
    if not item.get("topic"):
        return "topic is required"
    if frag.content_too_short(content):
        return TOO_SHORT
    return None


async def batch_remember(
    res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(BatchRememberArgs, arguments)
    results: list[dict[str, Any] | None] = [None] * len(args.fragments)
    planned: list[tuple[int, frag.NewFragment]] = []
    for i, item in enumerate(args.fragments):
        problem = _validate_item(item)
        if problem is None:
            try:
                parsed = RememberArgs.model_validate({**item, "agentId": item.get("agentId") or args.agentId})
                planned.append((i, build_fragment(parsed, ctx, args.workspace)))
                continue
            except ValidationError as exc:
                err = exc.errors()[0]
                problem = f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            except InvalidParams as exc:
                problem = exc.message
        results[i] = {"index": i, "success": False, "error": problem}

    principal = ctx.principal
    if planned:
        vectors = await res.embed([embedding_text(f) for _, f in planned])
        for (_, f), vector in zip(planned, vectors, strict=True):
            f.embedding = vector
        async with res.pool.acquire() as conn, conn.transaction():
            existing = await fragments_repo.find_by_hash(conn, principal, [(f.content_hash, f.workspace) for _, f in planned])
            fresh: list[tuple[int, frag.NewFragment]] = []
            seen: dict[tuple[str, str | None], str] = {}
            for i, f in planned:
                key = (f.content_hash, f.workspace)
                dup = existing.get(key) or seen.get(key)
                if dup:
                    results[i] = {"index": i, "success": True, "id": dup, "duplicate": True}
                else:
                    seen[key] = f.id
                    fresh.append((i, f))
            quota = await _lock_quota(conn, principal, len(fresh))
            if quota is not None:
                room = quota["limit"] - quota["used"]
                for i, _ in fresh[max(room, 0):]:
                    results[i] = {"index": i, "success": False, "error": QUOTA_EXCEEDED}
                fresh = fresh[: max(room, 0)]
            await _insert_isolated(conn, fresh, results)
            inserted = [f.id for i, f in fresh if results[i] and results[i]["success"]]  # type: ignore[index]
            if inserted:
                jobs.add("maintenance.link_new_fragments", fragment_ids=inserted)

    final = [r for r in results if r is not None]
    ok = sum(1 for r in final if r["success"])
    return {"success": True, "count": ok, "inserted": ok, "failed": len(final) - ok, "results": final}, False


async def _insert_isolated(conn: asyncpg.Connection, fresh: list[tuple[int, frag.NewFragment]], results: list[Any]) -> None:
    """One statement for the batch; if the database refuses it, item by item under savepoints
    so one bad row cannot block the others."""
    try:
        async with conn.transaction():
            await fragments_repo.insert_many(conn, [f for _, f in fresh])
        for i, f in fresh:
            results[i] = {"index": i, "success": True, "id": f.id}
        return
    except asyncpg.PostgresError:
        logger.warning("batch insert refused; retrying item by item", exc_info=True)
    for i, f in fresh:
        try:
            async with conn.transaction():
                await fragments_repo.insert_many(conn, [f])
            results[i] = {"index": i, "success": True, "id": f.id}
        except asyncpg.PostgresError as exc:
            results[i] = {"index": i, "success": False, "error": f"insert failed: {exc.__class__.__name__}"}
