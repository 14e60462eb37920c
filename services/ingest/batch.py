"""batch_remember (synchronous, or queued with async=true) and batch_status."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from pydantic import ValidationError
from redis.exceptions import RedisError

from services.common.internal import ToolContext, parse_arguments
from services.ingest.remember import cut_report
from services.ingest.service import QUOTA_EXCEEDED, TOO_SHORT, Screening, WriteResources, build_fragment, check_quota, lock_quota
from shared.contract.base import problems
from shared.contract.write import BatchRememberArgs, BatchStatusArgs, RememberArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams, Unavailable
from shared.domain.principal import Principal
from shared.domain.secrets import screen_value
from shared.jobs import LINK_TASK, QUEUE_BATCH, JobBuffer
from shared.repositories import fragments as fragments_repo
from shared.repositories import idempotency as idempotency_repo
from shared.repositories.batch_jobs import new_job_id

logger = logging.getLogger(__name__)

Planned = list[tuple[int, frag.NewFragment, str | None]]  # (index, fragment, idempotencyKey)


def validate_item(item: Any) -> str | None:
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


def plan_items(res: WriteResources, ctx: ToolContext, args: BatchRememberArgs, results: list[Any]) -> Planned:
    """Validate and build every item; failures land in results[i], the rest are returned."""
    planned: Planned = []
    screened_clean: set[tuple[str, str]] = set()  # Screening.clean, shared by the batch's items
    for i, item in enumerate(args.fragments):
        problem = validate_item(item)
        if problem is None:
            try:
                parsed = RememberArgs.model_validate({**item, "agentId": item.get("agentId") or args.agentId})
                planned.append((i, build_fragment(parsed, ctx, res.settings, args.workspace, screened_clean),
                                parsed.idempotencyKey))
                continue
            except ValidationError as exc:
                problem = problems(exc)[0]
            except InvalidParams as exc:
                problem = exc.message
        results[i] = {"index": i, "success": False, "error": problem}
    return planned


def _ok(i: int, fragment_id: str, **extra: Any) -> dict[str, Any]:
    return {"index": i, "success": True, "id": fragment_id, **extra}


async def _store(conn: asyncpg.Connection, principal: Principal, planned: Planned, results: list[Any]) -> list[str]:
    """Inside one transaction: quota under the key lock, content and idempotency
    de-duplication, then the insert. Returns the ids inserted."""
    quota = await lock_quota(conn, principal, 0)
    existing = await fragments_repo.find_by_hash(conn, principal, [(f.content_hash, f.workspace) for _, f, _ in planned])
    fresh: Planned = []
    claims: list[tuple[str, str]] = []
    seen: dict[tuple[str, str | None], str] = {}
    for i, f, key in planned:
        dup = existing.get((f.content_hash, f.workspace)) or seen.get((f.content_hash, f.workspace))
        if key:
            claims.append((key, dup or f.id))
        if dup:
            results[i] = _ok(i, dup, duplicate=True)
        else:
            seen[(f.content_hash, f.workspace)] = f.id
            fresh.append((i, f, key))
    won = await idempotency_repo.claim(conn, principal.key_id, claims)
    lost = [key for key, _ in claims if key not in won]
    if lost:  # a concurrent call (or an earlier attempt) stored these already
        earlier = await idempotency_repo.lookup(conn, principal.key_id, lost)
        for i, _f, key in planned:
            if key in earlier:
                results[i] = _ok(i, earlier[key], idempotent=True)
        fresh = [(i, f, key) for i, f, key in fresh if key not in earlier]
    if quota is not None:
        room = max(quota["limit"] - quota["used"], 0)
        over, fresh = fresh[room:], fresh[:room]
        for i, _, _ in over:
            results[i] = {"index": i, "success": False, "error": QUOTA_EXCEEDED}
        await idempotency_repo.release(conn, principal.key_id, [key for _, _, key in over if key])
    return await _insert_isolated(conn, principal, fresh, results)


async def _insert_isolated(conn: asyncpg.Connection, principal: Principal, fresh: Planned, results: list[Any]) -> list[str]:
    """One statement for the batch; if the database refuses it, item by item under savepoints
    so one bad row cannot block the others."""
    if not fresh:
        return []
    try:
        async with conn.transaction():
            await fragments_repo.insert_many(conn, [f for _, f, _ in fresh])
        for i, f, _ in fresh:
            results[i] = _ok(i, f.id)
        return [f.id for _, f, _ in fresh]
    except asyncpg.PostgresError:
        logger.warning("batch insert refused; retrying item by item", exc_info=True)
    inserted: list[str] = []
    for i, f, key in fresh:
        try:
            async with conn.transaction():
                await fragments_repo.insert_many(conn, [f])
            results[i] = _ok(i, f.id)
            inserted.append(f.id)
        except asyncpg.PostgresError as exc:
            results[i] = {"index": i, "success": False, "error": f"insert failed: {exc.__class__.__name__}"}
            if key:
                await idempotency_repo.release(conn, principal.key_id, [key])
    return inserted


async def _refresh_statistics(conn: asyncpg.Connection, inserted: int) -> None:
    """After the commit: the batch is stored, and a failed ANALYZE must not report it as
    failed (the planner's statistics catch up with autovacuum's next analyze)."""
    try:
        await fragments_repo.refresh_statistics_if_young(conn, inserted)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        logger.warning("statistics refresh after a batch failed", exc_info=True)


def _with_redactions(results: list[Any], planned: Planned) -> None:
    for i, f, _ in planned:
        if f.extra.get("secrets_redacted") and results[i] and results[i]["success"]:
            results[i]["secrets_redacted"] = f.extra["secrets_redacted"]


def _with_cuts(results: list[Any], planned: Planned, items: list[dict]) -> None:
    """A stored item whose content was cut at 300 characters says so, as remember's reply does."""
    for i, f, _ in planned:
        if results[i] and results[i]["success"]:
            results[i].update(cut_report(items[i]["content"], f.type))


async def store_batch(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, args: BatchRememberArgs) -> dict[str, Any]:
    results: list[dict[str, Any] | None] = [None] * len(args.fragments)
    planned = plan_items(res, ctx, args, results)
    principal = ctx.principal
    keys = [key for _, _, key in planned if key]
    if keys:
        # Retries of earlier calls answer from the idempotency records without embedding.
        async with res.pool.acquire() as conn:
            known = await idempotency_repo.lookup(conn, principal.key_id, keys)
        for i, _, key in planned:
            if key in known:
                results[i] = _ok(i, known[key], idempotent=True)
        planned = [(i, f, key) for i, f, key in planned if key not in known]
    if planned:
        await res.embed_fragments([f for _, f, _ in planned])
        async with res.pool.acquire() as conn:
            async with conn.transaction():
                inserted = await _store(conn, principal, planned, results)
                if inserted:
                    await jobs.record(conn, LINK_TASK, fragment_ids=inserted)
            if inserted:
                await _refresh_statistics(conn, len(inserted))
        _with_redactions(results, planned)
        _with_cuts(results, planned, args.fragments)

    final = [r for r in results if r is not None]
    ok = sum(1 for r in final if r["success"])
    return {"success": True, "count": ok, "inserted": ok, "failed": len(final) - ok, "results": final}


async def _queue_batch(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, args: BatchRememberArgs) -> dict[str, Any] | None:
    """seed async=true: validate, de-duplicate and check quota now; queue what passes."""
    queue = res.batch_queue()
    if queue is None:  # the caller routes async batches here only when Redis is configured
        raise Unavailable("async batch_remember needs Redis; it is not configured")
    results: list[dict[str, Any] | None] = [None] * len(args.fragments)
    planned = plan_items(res, ctx, args, results)
    principal = ctx.principal
    async with res.pool.acquire() as conn:
        existing = await fragments_repo.find_by_hash(conn, principal, [(f.content_hash, f.workspace) for _, f, _ in planned])
        known = await idempotency_repo.lookup(conn, principal.key_id, [k for _, _, k in planned if k])
        quota = await check_quota(conn, principal, 0)
    accepted: Planned = []
    seen: set[tuple[str, str | None]] = set()
    for i, f, key in planned:
        dup = existing.get((f.content_hash, f.workspace))
        if key in known:
            results[i] = {"index": i, "success": False, "error": "duplicate", "id": known[key], "idempotent": True}
        elif dup or (f.content_hash, f.workspace) in seen:
            results[i] = {"index": i, "success": False, "error": "duplicate", **({"id": dup} if dup else {})}
        else:
            seen.add((f.content_hash, f.workspace))
            accepted.append((i, f, key))
    if quota is not None:
        room = max(quota["limit"] - quota["used"], 0)
        for i, _, _ in accepted[room:]:
            results[i] = {"index": i, "success": False, "error": QUOTA_EXCEEDED}
        accepted = accepted[:room]

    job_id = new_job_id()
    items = []
    for i, _, key in accepted:
        # Each queued item carries an idempotency key, so a job run twice (a crashed
        # worker's job is retried) stores every fragment once.
        # The queue is storage too: the item goes to Redis redacted (its known fields passed
        # screening in plan_items; this catches arguments the worker will ignore).
        item = screen_value(f"fragments[{i}]", args.fragments[i], "redact", [])
        items.append({"index": i, "item": {**item, "idempotencyKey": key or f"{job_id}#{i}"}})
    payload = {
        "items": items, "workspace": args.workspace, "agentId": args.agentId,
        "principal": principal.to_wire(), "session": {"id": ctx.session_id, "transport_id": ctx.transport_id},
    }
    rejected = [r for r in results if r is not None]
    try:
        if items:
            await queue.enqueue(job_id, payload, accepted=len(items), rejected=len(rejected), key_id=principal.key_id)
    except RedisError:
        logger.warning("batch queue unavailable; storing synchronously", exc_info=True)
        return None
    if items:
        await _wake_batch_consumer(res, jobs, job_id)
    reply: dict[str, Any] = {"async": True, "accepted": len(items), "rejected": len(rejected), "jobId": job_id if items else None}
    if rejected:
        reply["errors"] = rejected
    return reply


async def _wake_batch_consumer(res: WriteResources, jobs: JobBuffer, job_id: str) -> None:
    """The job is on the Redis queue (its commit): the wake-up is only a shortcut, since
    beat's batch_recover takes any queued job, so failing to record it fails nothing."""
    try:
        async with res.pool.acquire() as conn:
            await jobs.record(conn, "maintenance.batch_remember", queue=QUEUE_BATCH, job_id=job_id)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        logger.warning("batch job %s queued without a wake-up; the periodic recovery will take it", job_id, exc_info=True)


async def batch_remember(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(BatchRememberArgs, arguments)
    # The batch's own fields (workspace, agentId) refuse the whole call; each item is screened
    # on its own in plan_items, so one bad item fails alone (results[i]).
    args = Screening(res.settings).args(args, skip=frozenset({"fragments"}))
    if args.async_ and res.redis is not None:
        queued = await _queue_batch(res, jobs, ctx, args)
        if queued is not None:
            return queued, False
    # seed: without Redis, async=true falls back to the synchronous path.
    return await store_batch(res, jobs, ctx, args), False


async def batch_status(res: WriteResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(BatchStatusArgs, arguments)
    queue = res.batch_queue()
    if queue is None:
        return {"jobId": args.jobId, "status": None}, False  # seed: Redis off -> status null
    data = await queue.status(args.jobId)
    principal = ctx.principal
    # Another tenant's job is indistinguishable from a missing one.
    if data is None or (not principal.is_master and data.get("key_id") != (principal.key_id or "")):
        return {"jobId": args.jobId, "state": None, "error": "Job not found"}, True
    return {
        "jobId": args.jobId,
        "state": data["state"],
        "accepted": int(data.get("accepted", 0)),
        "processed": int(data.get("processed", 0)),
        "failed": int(data.get("failed", 0)),
    }, False
