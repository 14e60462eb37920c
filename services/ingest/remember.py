"""remember: one fragment, with dryRun, idempotency, supersession, links, quota and the
policy gate."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from services.common.internal import ToolContext, parse_arguments
from services.ingest.feedback import attach_hint
from services.ingest.service import (
    CONFLICT_SIMILARITY,
    QUOTA_EXCEEDED,
    WriteResources,
    build_fragment,
    check_quota,
    lock_quota,
    workspace_not_allowed,
)
from shared.contract.write import RememberArgs
from shared.domain import fragment as frag
from shared.domain import policy
from shared.domain.errors import PolicyViolation
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.jobs import LINK_TASK, JobBuffer
from shared.repositories import fragments as fragments_repo
from shared.repositories import idempotency as idempotency_repo
from shared.repositories import links as links_repo
from shared.repositories import revisions as revisions_repo


async def conflicts_for(conn: asyncpg.Connection, principal: Principal, f: frag.NewFragment) -> list[dict[str, Any]]:
    """Live fragments of the same topic and workspace that say nearly the same thing."""
    flt = FragmentFilter(workspace=f.workspace, topic=f.topic)
    near = await fragments_repo.vector_candidates(conn, principal, flt, f.embedding, 3)
    hits = [(fid, sim) for fid, sim in near if sim >= CONFLICT_SIMILARITY]
    rows = await fragments_repo.fetch_by_ids(conn, principal, [fid for fid, _ in hits])
    return [
        {"id": fid, "content": rows[fid]["content"], "similarity": round(sim, 4)} for fid, sim in hits if fid in rows
    ]


async def _link_to(conn: asyncpg.Connection, principal: Principal, new_id: str, targets: list[str]) -> list[str]:
    visible = await fragments_repo.fetch_by_ids(conn, principal, targets)
    linked = [t for t in dict.fromkeys(targets) if t in visible and t != new_id]
    for target in linked:
        await links_repo.insert_link(conn, new_id, target, "related", 1.0, principal.key_id)
    return linked


async def _remember_again(
    conn: asyncpg.Connection, principal: Principal, args: RememberArgs, f: frag.NewFragment
) -> dict[str, Any] | None:
    """The reply for content this key already holds in this workspace (same content hash,
    same scope), or None. Like an idempotent replay, nothing is inserted: the stored copy is
    refreshed and its id returned with duplicate=true, so copies do not pile up until a
    consolidation merges them. The reply keeps every field of a stored one."""
    async with conn.transaction():
        row = await fragments_repo.find_duplicate(conn, principal, f.content_hash, f.workspace, f.scope)
        if row is None:
            return None
        if args.idempotencyKey:
            won = await idempotency_repo.claim(conn, principal.key_id, [(args.idempotencyKey, row["id"])])
            if not won:  # a concurrent retry of this call committed first
                existing = await idempotency_repo.lookup(conn, principal.key_id, [args.idempotencyKey])
                return {"success": True, "id": existing[args.idempotencyKey], "idempotent": True}
        ttl_tier = await fragments_repo.refresh_duplicate(conn, row["id"], f.importance, f.is_anchor)
        linked = await _link_to(conn, principal, row["id"], args.linkedTo) if args.linkedTo else []
    result: dict[str, Any] = {
        "success": True, "id": row["id"], "duplicate": True, "keywords": list(row["keywords"] or []),
        "ttl_tier": ttl_tier, "scope": row["scope"], "conflicts": [],
    }
    if linked:
        result["linked"] = linked
    result.update(cut_report(args.content, args.type))
    return result


def cut_report(content: str, fragment_type: str) -> dict[str, Any]:
    """seed: content of any type but episode is cut at 300 characters when stored; the reply
    says so, with the length given, instead of cutting silently."""
    given = len(content.strip())
    if fragment_type == "episode" or given <= frag.STORED_CONTENT_CHARS:
        return {}
    return {"truncated": True, "content_length": given, "stored_length": frag.STORED_CONTENT_CHARS}


def policy_warnings(
    res: WriteResources, args: RememberArgs, f: frag.NewFragment, conflicts: list[dict[str, Any]], principal: Principal
) -> list[str]:
    warnings: list[str] = []
    if res.settings.symbolic_policy_rules:
        subject = policy.PolicySubject(
            type=f.type, content=f.content, linked_to=len(args.linkedTo or []), case_id=f.case_id,
            resolution_status=f.resolution_status, workspace_source=f.workspace_source,
        )
        warnings.extend(policy.evaluate(subject, [c["content"] for c in conflicts]))
    if workspace_not_allowed(principal, f.workspace):
        warnings.append(policy.WORKSPACE_NOT_ALLOWED)
    return warnings


async def remember(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(RememberArgs, arguments)
    f = build_fragment(args, ctx, res.settings)
    principal = ctx.principal

    async with res.pool.acquire() as conn:
        if args.idempotencyKey and not args.dryRun:
            existing = await idempotency_repo.lookup(conn, principal.key_id, [args.idempotencyKey])
            if existing:
                return {"success": True, "id": existing[args.idempotencyKey], "idempotent": True}, False
        # The model embeds while this connection looks for a stored copy; only a copy found
        # takes _remember_again's transaction (which looks again, locking it).
        embedding = asyncio.create_task(res.embed_fragments([f]))
        try:
            if not args.dryRun and not args.supersedes and await fragments_repo.find_duplicate(
                conn, principal, f.content_hash, f.workspace, f.scope, lock=False
            ) is not None:
                duplicate = await _remember_again(conn, principal, args, f)
                if duplicate is not None:
                    return duplicate, False
            await embedding
        finally:
            embedding.cancel()  # a copy's reply does not wait for the model (no-op once done)
        conflicts = await conflicts_for(conn, principal, f)
        warnings = policy_warnings(res, args, f, conflicts, principal)

        if args.dryRun:
            simulated = {
                "fragment": {"content": f.content, "type": f.type, "topic": f.topic, "keywords": f.keywords,
                             "importance": f.importance, "workspace": f.workspace,
                             "workspace_source": f.workspace_source, "ttl_tier": f.ttl_tier, "scope": f.scope},
                "conflicts": conflicts,
                "validation_warnings": warnings,
                "quota": await check_quota(conn, principal, 1),
            }
            return {"dryRun": True, "simulated": simulated}, False

        if principal.symbolic_hard_gate:
            refused = policy.gating(warnings, workspace_gate=res.settings.workspace_gate)
            if refused:
                raise PolicyViolation(
                    f"policy_violation: {', '.join(refused)}", {"violations": refused, "fragmentType": f.type}
                )

        if not res.settings.remember_atomic:
            # seed: MEMENTO_REMEMBER_ATOMIC=false (the default) checks the quota before the
            # write, outside its transaction; concurrent writers of one key may overshoot.
            quota = await check_quota(conn, principal, 1)
            if quota is not None and quota["remaining"] < 0:
                return {"success": False, "error": QUOTA_EXCEEDED, "quota": quota}, True
        async with conn.transaction():
            if res.settings.remember_atomic:
                # seed _rememberAtomic: SELECT api_keys FOR UPDATE, then the quota re-check and
                # the INSERT in one BEGIN/COMMIT, so concurrent writers cannot overshoot.
                quota = await lock_quota(conn, principal, 1)
                if quota is not None and quota["remaining"] < 0:
                    return {"success": False, "error": QUOTA_EXCEEDED, "quota": quota}, True
            if args.idempotencyKey:
                won = await idempotency_repo.claim(conn, principal.key_id, [(args.idempotencyKey, f.id)])
                if not won:  # a concurrent retry committed first
                    existing = await idempotency_repo.lookup(conn, principal.key_id, [args.idempotencyKey])
                    return {"success": True, "id": existing[args.idempotencyKey], "idempotent": True}, False
            await fragments_repo.insert_many(conn, [f])
            superseded = await revisions_repo.supersede(conn, principal, f.id, args.supersedes) if args.supersedes else []
            linked = await _link_to(conn, principal, f.id, args.linkedTo) if args.linkedTo else []
            await jobs.record(conn, LINK_TASK, fragment_ids=[f.id])

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
    if f.extra.get("secrets_redacted"):
        result["secrets_redacted"] = f.extra["secrets_redacted"]
    result.update(cut_report(args.content, args.type))
    if quota is not None:
        result["quota"] = {**quota, "used": quota["used"] + 1}
    return await attach_hint(res, "remember", ctx.session_id, result), False
