"""Turning ranked hits into response fragments inside the token budget."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from services.recall.meta import explanations
from shared.contract.read import RecallArgs
from shared.domain.principal import Principal
from shared.domain.search import RankedHit
from shared.domain.tokens import TokenCounter
from shared.repositories import recall_views

# seed: stitched_context for the top 3 with material, within 40% of the response budget.
STITCH_TOP = 3
STITCH_BUDGET_SHARE = 0.4
STITCH_WINDOW_MIN = 30
LINKS_PER_FRAGMENT = 5
# A linked fragment is a pointer, not a second result: id, type, relation and the first
# words, enough to decide whether to recall it (bench/reply_tokens.py: with 200 characters
# of each link, a default reply of two linked facts cost 783 tokens). The reference leaves
# the link's shape open; stitched_context's causal items keep their documented content.
LINK_PREVIEW_CHARS = 80
CAUSAL_PREVIEW_CHARS = 200


def preview(content: str, limit: int) -> dict[str, Any]:
    """The content cut to limit characters; a cut says so (truncated, content_length) rather
    than passing for the whole text."""
    if len(content) <= limit:
        return {"content": content}
    return {"content": content[:limit].rstrip() + "…", "truncated": True, "content_length": len(content)}


def link_item(link: dict[str, Any], in_reply: set[str]) -> dict[str, Any]:
    """A linked fragment: a result of this same reply is named by id only (its content is
    right there); any other carries a short preview."""
    item = {"id": link["id"], "relation_type": link["relation_type"], "direction": link["direction"]}
    if link["id"] in in_reply:
        return item
    return {**item, "type": link["type"], **preview(link["content"], LINK_PREVIEW_CHARS)}


def iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z") if value else None


def base_fragment(row: asyncpg.Record, score: float) -> dict[str, Any]:
    return {
        "id": row["id"],
        "content": row["content"],
        "type": row["type"],
        "topic": row["topic"],
        "keywords": list(row["keywords"]),
        "importance": round(float(row["importance"]), 4),
        "created_at": iso(row["created_at"]),
        "access_count": row["access_count"],
        "confidence": round(score, 6),
        "workspace": row["workspace"],
        "context_summary": row["context_summary"],
        "case_id": row["case_id"],
        "valid_to": iso(row["valid_to"]),
        "affect": row["affect"],
        "ema_activation": round(float(row["ema_activation"]), 4),
        "key_id": row["key_id"],
        "agent_id": row["agent_id"],
    }


def select_fields(full: dict[str, Any], args: RecallArgs) -> dict[str, Any]:
    if args.fields:
        wanted = set(args.fields)
        return {k: v for k, v in full.items() if k in wanted}
    if not args.includeKeywords:
        full.pop("keywords", None)
    return full


async def decorate(
    conn: asyncpg.Connection, principal: Principal, args: RecallArgs, window: list[RankedHit],
    rows: dict[str, asyncpg.Record], *, explain: bool, time_filtered: bool,
) -> list[dict[str, Any]]:
    """Full fragments (before field selection) with links, key names, context, explanations."""
    ids = [h.id for h in window if h.id in rows]
    wanted = set(args.fields) if args.fields else None
    links: dict[str, list[dict[str, Any]]] = {}
    if args.includeLinks and (wanted is None or "linked" in wanted):
        links = await recall_views.links_of(conn, principal, ids, args.linkRelationType, LINKS_PER_FRAGMENT)
    names: dict[str, str] = {}
    if args.includeKeyName:
        names = await recall_views.key_names(conn, sorted({rows[i]["key_id"] for i in ids if rows[i]["key_id"]}))
    around: dict[str, dict[str, list[asyncpg.Record]]] = {}
    if args.includeContext:
        around = await recall_views.surrounding(conn, principal, ids, width=2, window_minutes=None)
    in_reply = set(ids)
    out = []
    for hit in window:
        row = rows.get(hit.id)
        if row is None:
            continue
        full = base_fragment(row, hit.score)
        if args.includeLinks:
            full["linked"] = [link_item(link, in_reply) for link in links.get(hit.id, [])]
        if args.includeKeyName:
            full["key_name"] = names.get(row["key_id"]) if row["key_id"] else "master"
        if args.includeContext:
            sides = around.get(hit.id, {"pre": [], "post": []})
            full["nearby_context"] = [
                {"id": r["id"], "content": r["content"], "type": r["type"], "created_at": iso(r["created_at"]),
                 "position": side}
                for side in ("pre", "post") for r in (sides["pre"][-1:] if side == "pre" else sides["post"][:1])
            ]
        if explain:
            full["explanations"] = explanations(
                hit.layers, time_filtered=time_filtered, case_mode=args.caseMode, has_case=row["case_id"] is not None,
                activation=float(row["ema_activation"]),
            )
        out.append(full)
    return out


async def stitch(
    conn: asyncpg.Connection, principal: Principal, fragments: list[dict[str, Any]], tokens: TokenCounter, budget: int
) -> None:
    """stitched_context on the top 3 that have material: same-session turns within 30 minutes
    before and after, and causal links; cut to one each side past 40% of the budget."""
    top = [f for f in fragments[:STITCH_TOP] if "id" in f]
    if not top:
        return
    ids = [f["id"] for f in top]
    around = await recall_views.surrounding(conn, principal, ids, width=3, window_minutes=STITCH_WINDOW_MIN)
    causal_links = await recall_views.links_of(conn, principal, ids, None, LINKS_PER_FRAGMENT)
    stitched: dict[str, dict[str, Any]] = {}
    for f in top:
        sides = around.get(f["id"], {"pre": [], "post": []})
        causal = [
            {"id": link["id"], "relation_type": link["relation_type"], "direction": link["direction"],
             **preview(link["content"], CAUSAL_PREVIEW_CHARS)}
            for link in causal_links.get(f["id"], []) if link["relation_type"] in recall_views.CAUSAL_RELATIONS
        ]
        if not sides["pre"] and not sides["post"] and not causal:
            continue
        target_at = (sides["pre"] or sides["post"])[0]["target_at"] if (sides["pre"] or sides["post"]) else None

        def turn(r: asyncpg.Record) -> dict[str, Any]:
            delta = round((r["created_at"] - r["target_at"]).total_seconds() / 60)
            return {"id": r["id"], "content": r["content"], "type": r["type"], "created_at": iso(r["created_at"]),
                    "delta_min": delta}

        stitched[f["id"]] = {
            "target": {"id": f["id"], "created_at": iso(target_at) if target_at else f.get("created_at")},
            "pre": [turn(r) for r in sides["pre"]],
            "post": [turn(r) for r in sides["post"]],
            "causal": causal,
        }
    if tokens.count_json(list(stitched.values())) > budget * STITCH_BUDGET_SHARE:
        for s in stitched.values():
            s["pre"], s["post"] = s["pre"][-1:], s["post"][:1]
    for f in top:
        if f["id"] in stitched:
            f["stitched_context"] = stitched[f["id"]]


def pack(tokens: TokenCounter, rendered: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Fill the token budget best-first; what does not fit is left for the next page."""
    packed: list[dict[str, Any]] = []
    used = 0
    for item in rendered:
        cost = tokens.count_json(item)
        if used + cost > budget:
            if packed:
                break
            # The best hit alone is over budget: drop its extras, then cut its content.
            for extra in ("stitched_context", "nearby_context", "linked"):
                if extra in item:
                    item.pop(extra)
                    cost = tokens.count_json(item)
            if cost > budget and "content" in item:
                overflow = cost - budget
                keep = max(len(item["content"]) - overflow * 4, 20)
                item.update(preview(item["content"], keep))
                cost = tokens.count_json(item)
        packed.append(item)
        used += cost
    return packed, used
