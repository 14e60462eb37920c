"""link: relate two of the caller's fragments; directed relations may not form a cycle."""

from __future__ import annotations

from typing import Any

from services.common.internal import ToolContext, parse_arguments
from services.ingest.service import WriteResources
from shared.contract.write import LinkArgs
from shared.domain.errors import InvalidParams
from shared.jobs import JobBuffer
from shared.repositories import links as links_repo
from shared.repositories import revisions as revisions_repo

NOT_FOUND = "Fragment not found"


async def link(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(LinkArgs, arguments)
    if args.fromId == args.toId:
        raise InvalidParams("Invalid params: fromId and toId must differ")
    principal = ctx.principal
    async with res.pool.acquire() as conn, conn.transaction():
        # seed: another tenant's fragment answers "Fragment not found" (its existence is not revealed).
        owned = await revisions_repo.owned_ids(conn, principal, [args.fromId, args.toId])
        missing = [fid for fid in (args.fromId, args.toId) if fid not in owned]
        cycle = None
        if not missing and args.relationType in links_repo.DIRECTED_RELATIONS:
            back = await links_repo.path_between(conn, args.toId, args.fromId, args.relationType)
            cycle = [*back, args.toId] if back else None
        existing = None if missing else await links_repo.get_link(conn, args.fromId, args.toId, args.relationType)

        if args.dryRun:
            return {
                "dryRun": True,
                "fromId": args.fromId, "toId": args.toId, "relationType": args.relationType, "weight": args.weight,
                "ownership": "ok" if not missing else "not_found",
                "cycle": cycle is not None,
                **({"cyclePath": cycle} if cycle else {}),
                "exists": existing is not None,
                "wouldCreate": not missing and cycle is None and existing is None,
            }, False
        if missing:
            return {"success": False, "error": NOT_FOUND}, True
        if cycle:
            return {
                "success": False,
                "error": f"Link would create a cycle of {args.relationType} relations",
                "cyclePath": cycle,
            }, True
        created = await links_repo.upsert_link(conn, args.fromId, args.toId, args.relationType, args.weight, principal.key_id)
    return {
        "success": True, "fromId": args.fromId, "toId": args.toId, "relationType": args.relationType,
        "weight": args.weight, "created": created,
    }, False
