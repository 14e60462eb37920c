"""forget: by id or by topic, permanent fragments only with force (seed's three replies)."""

from __future__ import annotations

from typing import Any

from services.common.internal import ToolContext, parse_arguments
from services.ingest.artifacts import purge_after_forget
from services.ingest.feedback import attach_hint
from services.ingest.service import RETRY_CONFLICTS, WriteResources
from shared.contract.write import ForgetArgs
from shared.domain.errors import InvalidParams
from shared.repositories import fragments as fragments_repo

NOT_FOUND = "Fragment not found or no permission"
PROTECTED = "permanent 파편은 force 옵션 필요"


async def forget(res: WriteResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(ForgetArgs, arguments)
    if not args.id and not args.topic:
        raise InvalidParams("Invalid params: id or topic is required")
    async with res.pool.acquire() as conn:
        if args.dryRun:
            rows = await fragments_repo.preview_delete(conn, ctx.principal, fragment_id=args.id, topic=args.topic)
            targets = [
                {"id": r["id"], "topic": r["topic"], "type": r["type"], "ttl_tier": r["ttl_tier"],
                 "content": r["content"], "linkCount": r["link_count"],
                 "protected": r["ttl_tier"] == "permanent" and not args.force}
                for r in rows
            ]
            return {
                "dryRun": True,
                "wouldDelete": sum(1 for t in targets if not t["protected"]),
                "protected": sum(1 for t in targets if t["protected"]),
                "linkCount": sum(t["linkCount"] for t in targets),
                "targets": targets,
            }, False
        async for attempt in RETRY_CONFLICTS.copy():
            with attempt:
                async with conn.transaction():
                    if args.id:
                        deleted, protected = await fragments_repo.delete_by_id(conn, ctx.principal, args.id, force=args.force)
                    else:
                        deleted, protected = await fragments_repo.delete_by_topic(
                            conn, ctx.principal, args.topic or "", force=args.force)
    if deleted == 0 and protected:
        return {"success": True, "deleted": 0, "protected": protected, "reason": PROTECTED}, False
    if deleted == 0:
        # seed: success stays true, but the error key turns the MCP envelope into isError.
        return {"success": True, "deleted": 0, "error": NOT_FOUND}, True
    # The deleted memories' artifacts went with their rows (migration 0020); their stored
    # objects are deleted now, after the commit.
    await purge_after_forget(res)
    result: dict[str, Any] = {"success": True, "deleted": deleted}
    if protected:
        result["protected"] = protected
    return await attach_hint(res, "forget", ctx.session_id, result), False
