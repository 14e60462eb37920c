"""The read path: layered candidates, fusion, token-budget packing."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import asyncpg
import numpy as np

from services.common.internal import ToolContext, parse_arguments
from services.recall.fusion import fuse_ranked_lists
from shared.contract.read import RecallArgs
from shared.domain.errors import InvalidParams
from shared.domain.keywords import extract_keywords
from shared.domain.search import DEPTH_TYPES, FragmentFilter
from shared.domain.tokens import TokenCounter
from shared.embeddings import Embedder
from shared.repositories import events as events_repo
from shared.repositories import fragments as fragments_repo

# Candidates each layer contributes before fusion; pageSize is at most 50.
LAYER_DEPTH = 60
KST = ZoneInfo("Asia/Seoul")
_WEEKDAYS_KO = "월화수목금토일"


@dataclass
class ReadResources:
    pool: asyncpg.Pool
    embedder: Embedder
    tokens: TokenCounter

    async def embed_query(self, text: str) -> np.ndarray:
        return (await anyio.to_thread.run_sync(self.embedder.embed, [text]))[0]


def server_time(now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(timezone.utc)
    kst = now.astimezone(KST)
    return {
        "iso": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "epoch_ms": int(now.timestamp() * 1000),
        "display_kst": f"{kst.year}년 {kst.month}월 {kst.day}일 ({_WEEKDAYS_KO[kst.weekday()]}) {kst:%H:%M}",
        "timezone": "Asia/Seoul",
    }


def _parse_time(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidParams(f"Invalid params: {name}: not an ISO 8601 date-time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def build_filter(args: RecallArgs, ctx: ToolContext) -> FragmentFilter:
    types: tuple[str, ...] | None = (args.type,) if args.type else None
    if args.depth and DEPTH_TYPES[args.depth] is not None:
        depth_types = DEPTH_TYPES[args.depth]
        types = tuple(t for t in (types or depth_types) if t in depth_types)  # type: ignore[union-attr]
    affects = (args.affect,) if isinstance(args.affect, str) else (tuple(args.affect) if args.affect else None)
    return FragmentFilter(
        workspace=args.workspace if args.workspace is not None else ctx.principal.default_workspace,
        topic=args.topic,
        types=types,
        include_superseded=args.includeSuperseded,
        agent_id=args.agentId if args.agentId and not args.includePeerAgents else None,
        min_importance=args.minImportance,
        is_anchor=args.isAnchor,
        affects=affects,
        case_id=args.caseId,
        resolution_status=args.resolutionStatus,
        phase=args.phase,
        time_from=_parse_time("timeRange.from", args.timeRange.from_ if args.timeRange else None),
        time_to=_parse_time("timeRange.to", args.timeRange.to if args.timeRange else None),
        as_of=_parse_time("asOf", args.asOf),
        caller_session=ctx.session_id,
    )


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        return int(json.loads(base64.urlsafe_b64decode(cursor.encode()).decode())["offset"])
    except (ValueError, KeyError, TypeError):
        raise InvalidParams("Invalid params: cursor: not a cursor this server issued") from None


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def render_fragment(row: asyncpg.Record, *, score: float, args: RecallArgs, layers: set[str]) -> dict[str, Any]:
    full: dict[str, Any] = {
        "id": row["id"],
        "content": row["content"],
        "type": row["type"],
        "topic": row["topic"],
        "importance": round(float(row["importance"]), 4),
        "created_at": _iso(row["created_at"]),
        "access_count": row["access_count"],
        "confidence": round(score, 6),
        "workspace": row["workspace"],
        "context_summary": row["context_summary"],
        "case_id": row["case_id"],
        "valid_to": _iso(row["valid_to"]),
        "affect": row["affect"],
        "ema_activation": round(float(row["ema_activation"]), 4),
        "key_id": row["key_id"],
        "agent_id": row["agent_id"],
        "keywords": list(row["keywords"]),
    }
    if args.fields:
        wanted = set(args.fields)
        return {k: v for k, v in full.items() if k in wanted}
    if not args.includeKeywords:
        full.pop("keywords")
    return full


async def recall(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    started = time.perf_counter()
    args = parse_arguments(RecallArgs, arguments)
    if not args.text and not args.keywords and not args.topic and not args.caseId:
        raise InvalidParams("Invalid params: one of text, keywords, topic or caseId is required")
    flt = build_filter(args, ctx)
    offset = _decode_cursor(args.cursor)
    lexical_terms = [*(args.keywords or []), *extract_keywords(args.text or "", 16)]
    semantic_text = args.text or " ".join([*(args.keywords or []), args.contextText or ""]).strip()

    vector = await res.embed_query(semantic_text) if semantic_text else None
    path: list[str] = []
    async with res.pool.acquire() as conn:
        layers: dict[str, list[tuple[str, float]]] = {}
        if lexical_terms:
            layers["L2"] = await fragments_repo.lexical_candidates(
                conn, ctx.principal, flt, lexical_terms, args.keywords or [], LAYER_DEPTH
            )
            path.append(f"L2:{len(layers['L2'])}")
        if vector is not None:
            semantic = await fragments_repo.vector_candidates(conn, ctx.principal, flt, vector, LAYER_DEPTH)
            if args.threshold is not None:
                semantic = [(fid, sim) for fid, sim in semantic if sim >= args.threshold]
            layers["L3"] = semantic
            path.append(f"{'L3' if args.text else 'L3kw'}:{len(semantic)}")
        if not layers and (args.topic or args.caseId):
            layers["filter"] = await fragments_repo.filtered_recent(conn, ctx.principal, flt, LAYER_DEPTH)
            path.append(f"filter:{len(layers['filter'])}")

        fused = fuse_ranked_lists(layers)
        window = fused[offset : offset + args.pageSize]
        rows = await fragments_repo.fetch_by_ids(conn, ctx.principal, [h.id for h in window])
        fragments, used_tokens = _pack(res.tokens, window, rows, args)
        has_more = offset + len(fragments) < len(fused)
        event_id = await events_repo.record_search(
            conn,
            key_id=ctx.principal.key_id,
            session_id=ctx.session_id,
            query_type="mixed" if args.text and args.keywords else ("text" if args.text else "keywords"),
            query_text=args.text,
            keywords=args.keywords,
            filters={k: v for k, v in arguments.items() if k not in ("text", "keywords")},
            result_ids=[f["id"] for f in fragments if "id" in f] or [h.id for h in window[: len(fragments)]],
            search_path=" → ".join(path),
            latency_ms=(time.perf_counter() - started) * 1000,
        )
    hints = []
    if not fragments:
        hints.append({
            "signal": "no_results",
            "suggestion": "이 주제에 대한 기억이 없습니다. 중요한 내용이라면 remember로 저장하세요.",
            "trigger": "remember",
        })
    meta: dict[str, Any] = {"searchEventId": event_id, "hints": hints, "serverTime": server_time()}
    if not fragments and not args.contextText:
        meta["suggestion"] = {"code": "empty_result_no_context", "recommendedTool": "recall"}
    return {
        "fragments": fragments,
        "count": len(fragments),
        "totalTokens": used_tokens,
        "searchPath": " → ".join(path),
        "hasMore": has_more,
        "nextCursor": _encode_cursor(offset + len(fragments)) if has_more else None,
        "_meta": meta,
    }, False


def _pack(tokens: TokenCounter, window: list[Any], rows: dict[str, asyncpg.Record], args: RecallArgs) -> tuple[list[dict[str, Any]], int]:
    """Fill the token budget best-first; what does not fit is left for the next page."""
    packed: list[dict[str, Any]] = []
    used = 0
    for hit in window:
        row = rows.get(hit.id)
        if row is None:
            continue
        rendered = render_fragment(row, score=hit.score, args=args, layers=hit.layers)
        cost = tokens.count_json(rendered)
        if used + cost > args.tokenBudget:
            if packed:
                break
            # The best hit alone is over budget: cut its content rather than return nothing.
            if "content" in rendered:
                overflow = cost - args.tokenBudget
                keep = max(len(rendered["content"]) - overflow * 4, 20)
                rendered["content"] = rendered["content"][:keep] + "…"
                rendered["truncated"] = True
                cost = tokens.count_json(rendered)
        packed.append(rendered)
        used += cost
    return packed, used
