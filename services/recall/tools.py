"""The read tools besides recall: context, search_traces, reconstruct_history, graph_explore,
fragment_history, memory_stats, tool_feedback."""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg
from redis.exceptions import RedisError

from services.common.internal import ToolContext, parse_arguments
from services.recall import meta as meta_mod
from services.recall.render import base_fragment, iso
from services.recall.service import SEEN_KEY, ReadResources
from services.recall.timeparse import parse_bound
from shared.contract.read import (
    ContextArgs,
    FragmentHistoryArgs,
    GraphExploreArgs,
    MemoryStatsArgs,
    ReconstructHistoryArgs,
    SearchTracesArgs,
    ToolFeedbackArgs,
)
from shared.domain.errors import InvalidParams
from shared.domain.principal import Principal
from shared.domain.secrets import screen_args
from shared.read_routing import on_primary
from shared.repositories import events as events_repo
from shared.repositories import fragments as fragments_repo
from shared.repositories import history as history_repo
from shared.repositories import read_stats

logger = logging.getLogger(__name__)

CONTEXT_DEFAULT_TYPES = ["preference", "error", "procedure"]
REFLECT_TOPIC = "session_reflect"
# Share of context()'s budget for core memory; the rest is the session's working memory and reflections.
CORE_SHARE = 0.6
SEEN_TTL_S = 24 * 3600
IRRELEVANCE_REASONS = {"not_stored", "search_miss", "scope_leak", "topic_mismatch", "other"}
# tool_feedback on named fragments: activation moves by these amounts (bounded to [0, 1]).
FEEDBACK_ACTIVATION = {(True, True): 0.1, (True, False): 0.05, (False, True): -0.1, (False, False): -0.1}


def _trace(row: asyncpg.Record) -> dict[str, Any]:
    out = base_fragment(row, 1.0)
    out.pop("confidence")
    out.update({"session_id": row["session_id"], "phase": row["phase"], "resolution_status": row["resolution_status"]})
    return out


def _not_found(what: str) -> tuple[dict[str, Any], bool]:
    return {"success": False, "error": f"{what} not found or no permission"}, True


# ---------------------------------------------------------------- context

async def context(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    started = time.perf_counter()
    args: ContextArgs = parse_arguments(ContextArgs, arguments)
    types = list(args.types or CONTEXT_DEFAULT_TYPES)
    workspace = args.workspace if args.workspace is not None else ctx.principal.default_workspace
    session_id = args.sessionId or ctx.session_id
    async with res.pool.acquire() as conn:
        core = await history_repo.core_memory(conn, ctx.principal, types=types, workspace=workspace, agent_id=args.agentId, limit=100)
        session: dict[str, list[Any]] = {"working": [], "reflections": []}
        if session_id:
            session = await history_repo.session_fragments(
                conn, ctx.principal, session_id=session_id, reflect_topic=REFLECT_TOPIC, limit=50
            )
        unreflected = await history_repo.unreflected_sessions(conn, ctx.principal, session_id)
        names = {}
        if args.includeKeyName:
            from shared.repositories import recall_views

            names = await recall_views.key_names(conn, sorted({r["key_id"] for r in core if r["key_id"]}))

        def item(row: asyncpg.Record, memory: str) -> dict[str, Any]:
            out = base_fragment(row, float(row["importance"]))
            out.pop("confidence")
            out.pop("keywords")
            out["memory"] = memory
            if args.includeKeyName and not args.structured:
                out["key_name"] = names.get(row["key_id"]) if row["key_id"] else "master"
            return out

        used = 0
        core_budget = int(args.tokenBudget * CORE_SHARE) if session["working"] or session["reflections"] else args.tokenBudget
        picked: list[dict[str, Any]] = []
        for row in core:
            frag = item(row, "core")
            cost = res.tokens.count_json(frag)
            if used + cost > core_budget:
                continue
            picked.append(frag)
            used += cost
        for label, rows in (("working", session["working"]), ("session_reflect", session["reflections"])):
            for row in rows:
                frag = item(row, label)
                cost = res.tokens.count_json(frag)
                if used + cost > args.tokenBudget:
                    continue
                picked.append(frag)
                used += cost
        ids = [f["id"] for f in picked]
        event_id = await on_primary(res.pool, conn, events_repo.next_search_event_id)  # a standby refuses nextval
    if ctx.session_id and ids and res.redis is not None:
        # recall(excludeSeen=true) skips what context() already put in front of this session.
        try:
            key = SEEN_KEY.format(session=ctx.session_id)
            pipe = res.redis.pipeline(transaction=False)
            pipe.sadd(key, *ids)
            pipe.expire(key, SEEN_TTL_S)
            await pipe.execute()
        except RedisError:
            logger.warning("could not record context-injected fragments")
    await res.effects.submit({
        "event": events_repo.search_event_row(
            event_id=event_id, key_id=ctx.principal.key_id, session_id=ctx.session_id, query_type="context",
            query_text=None, keywords=None, filters=arguments, result_ids=ids, search_path="context",
            latency_ms=(time.perf_counter() - started) * 1000,
        ),
        "accessed": ids,
    })
    hints = []
    if unreflected:
        hints.append({
            "signal": "unreflected_sessions",
            "suggestion": f"reflect되지 않은 지난 세션이 {unreflected}개 있습니다. reflect로 학습 내용을 영속화하세요.",
            "trigger": "reflect",
            "count": unreflected,
        })
    result: dict[str, Any] = {"success": True, "count": len(picked), "totalTokens": used}
    if args.structured:
        tree: dict[str, Any] = {"core": {t: [] for t in types}, "working": [], "session_reflect": []}
        for row in picked:
            frag = {k: v for k, v in row.items() if k not in ("memory", "key_id", "key_name")} | {"memory": row["memory"]}
            if frag["memory"] == "core":
                tree["core"].setdefault(frag["type"], []).append(frag)
            else:
                tree[frag["memory"]].append(frag)
        result.update({"structured": True, "tree": tree})
    else:
        result["fragments"] = picked
    if unreflected:
        result["unreflectedSessions"] = unreflected
    result["_meta"] = {"searchEventId": event_id, "hints": hints, "serverTime": meta_mod.server_time()}
    return result, False


# ---------------------------------------------------------------- search_traces

async def search_traces(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: SearchTracesArgs = parse_arguments(SearchTracesArgs, arguments)
    tr = args.time_range
    async with res.pool.acquire() as conn:
        rows = await history_repo.search_traces(
            conn, ctx.principal,
            type_=args.event_type or args.eventType, entity=args.entity_key or args.entityKey, keyword=args.keyword,
            case_id=args.case_id or args.caseId, session_id=args.session_id or args.sessionId,
            time_from=parse_bound("time_range.from", tr.from_, end=False) if tr else None,
            time_to=parse_bound("time_range.to", tr.to, end=True) if tr else None,
            workspace=args.workspace if args.workspace is not None else ctx.principal.default_workspace,
            limit=args.limit,
        )
    traces = [_trace(r) for r in rows]
    return {"success": True, "traces": traces, "count": len(traces)}, False


# ---------------------------------------------------------------- reconstruct_history

async def reconstruct_history(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: ReconstructHistoryArgs = parse_arguments(ReconstructHistoryArgs, arguments)
    if not args.caseId and not args.entity:
        raise InvalidParams("Invalid params: caseId: caseId or entity is required")
    tr = args.timeRange
    async with res.pool.acquire() as conn:
        rows = await history_repo.timeline(
            conn, ctx.principal, case_id=args.caseId, entity=args.entity, query=args.query,
            time_from=parse_bound("timeRange.from", tr.from_, end=False) if tr else None,
            time_to=parse_bound("timeRange.to", tr.to, end=True) if tr else None,
            workspace=args.workspace if args.workspace is not None else ctx.principal.default_workspace,
            limit=args.limit,
        )
        ids = [r["id"] for r in rows]
        links = await history_repo.links_among(conn, ids)
        events = await history_repo.case_events(conn, ctx.principal, args.caseId) if args.caseId else []
    by_id = {r["id"]: r for r in rows}
    timeline = [
        {"id": r["id"], "content": r["content"], "type": r["type"], "topic": r["topic"], "created_at": iso(r["created_at"]),
         "agent_id": r["agent_id"], "case_id": r["case_id"], "phase": r["phase"],
         "resolution_status": r["resolution_status"], "importance": round(float(r["importance"]), 4)}
        for r in rows
    ]
    chains = _causal_chains(links, by_id)
    resolved = {link["from_id"] for link in links if link["relation_type"] == "resolved_by"} | {
        link["to_id"] for link in links if link["relation_type"] == "resolved_by" and by_id.get(link["from_id"], {}).get("type") != "error"
    }
    unresolved = [
        {"id": r["id"], "content": r["content"], "type": r["type"], "created_at": iso(r["created_at"]),
         "agent_id": r["agent_id"], "reason": "open" if r["resolution_status"] == "open" else "error_without_resolution"}
        for r in rows
        if r["valid_to"] is None and (
            r["resolution_status"] == "open"
            or (r["type"] == "error" and r["resolution_status"] not in ("resolved", "abandoned") and r["id"] not in resolved)
        )
    ]
    return {
        "success": True,
        "caseId": args.caseId,
        "entity": args.entity,
        "ordered_timeline": timeline,
        "causal_chains": chains,
        "unresolved_branches": unresolved,
        "case_events": [
            {"event_type": e["event_type"], "summary": e["summary"], "fragment_id": e["fragment_id"], "created_at": iso(e["created_at"])}
            for e in events
        ],
        "count": len(timeline),
    }, False


def _causal_chains(links: list[asyncpg.Record], by_id: dict[str, asyncpg.Record]) -> list[dict[str, Any]]:
    """Connected groups over caused_by / resolved_by links, each in time order."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = [link for link in links if link["relation_type"] in ("caused_by", "resolved_by")]
    for link in edges:
        parent[find(link["from_id"])] = find(link["to_id"])
    groups: dict[str, list[str]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    chains = []
    for members in groups.values():
        ordered = sorted(members, key=lambda i: (by_id[i]["created_at"], by_id[i]["seq"] or 0))
        chains.append({
            "fragments": [{"id": i, "type": by_id[i]["type"], "content": by_id[i]["content"]} for i in ordered],
            "links": [
                {"from": link["from_id"], "to": link["to_id"], "relation_type": link["relation_type"]}
                for link in edges if link["from_id"] in members
            ],
        })
    return chains


# ---------------------------------------------------------------- graph_explore

async def graph_explore(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: GraphExploreArgs = parse_arguments(GraphExploreArgs, arguments)
    async with res.pool.acquire() as conn:
        start = await history_repo.fragment(conn, ctx.principal, args.startId)
        if start is None or (args.agentId and start["agent_id"] != args.agentId):
            return _not_found("Fragment")
        neighbours = await history_repo.causal_neighbours(conn, ctx.principal, args.startId)
    causes: list[dict[str, Any]] = []
    effects: list[dict[str, Any]] = []
    resolutions: list[dict[str, Any]] = []
    resolves: list[dict[str, Any]] = []
    for r in neighbours:
        node = {"id": r["id"], "content": r["content"], "type": r["type"], "topic": r["topic"],
                "created_at": iso(r["created_at"]), "relation_type": r["relation_type"], "direction": r["direction"],
                "weight": round(float(r["weight"]), 4)}
        if r["relation_type"] == "caused_by":
            (causes if r["direction"] == "out" else effects).append(node)
        else:
            (resolutions if r["direction"] == "out" else resolves).append(node)
    # The chain reads cause -> start -> resolution (RCA order).
    chain = [*causes, {"id": start["id"], "content": start["content"], "type": start["type"], "role": "start"}, *resolutions]
    return {
        "success": True,
        "start": _trace(start),
        "rootCauses": causes,
        "resolutions": resolutions,
        "effects": effects,
        "resolves": resolves,
        "chain": chain,
        "resolved": bool(resolutions) or start["resolution_status"] == "resolved",
        "count": len(neighbours),
    }, False


# ---------------------------------------------------------------- fragment_history

async def fragment_history(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: FragmentHistoryArgs = parse_arguments(FragmentHistoryArgs, arguments)
    async with res.pool.acquire() as conn:
        row = await history_repo.fragment(conn, ctx.principal, args.id)
        if row is None or (args.agentId and not args.includePeerAgents and row["agent_id"] != args.agentId):
            return _not_found("Fragment")
        versions = await history_repo.versions(conn, args.id)
        chain = await history_repo.supersession_chain(conn, ctx.principal, args.id)
    return {
        "success": True,
        "id": args.id,
        "current": _trace(row) | {"superseded_by": row["superseded_by"], "valid_from": iso(row["valid_from"])},
        "versions": [
            {"version": v["version"], "content": v["content"], "topic": v["topic"], "type": v["type"],
             "keywords": list(v["keywords"]), "importance": round(float(v["importance"]), 4),
             "changed_by": v["changed_by"], "created_at": iso(v["created_at"])}
            for v in versions
        ],
        "superseded_by_chain": [
            {"id": r["id"], "content": r["content"], "type": r["type"], "created_at": iso(r["created_at"]),
             "valid_to": iso(r["valid_to"]), "superseded_by": r["superseded_by"]}
            for r in chain["newer"]
        ],
        "supersedes": [
            {"id": r["id"], "content": r["content"], "type": r["type"], "created_at": iso(r["created_at"]),
             "valid_to": iso(r["valid_to"])}
            for r in chain["older"]
        ],
        "versionCount": len(versions),
    }, False


# ---------------------------------------------------------------- memory_stats

async def memory_stats(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    parse_arguments(MemoryStatsArgs, arguments)
    async with res.pool.acquire() as conn:
        stats = await fragments_repo.stats(conn, ctx.principal)
        stats["evaluation"] = await read_stats.evaluation(conn, ctx.principal)
        stats["workspaces"] = await read_stats.workspaces(conn, ctx.principal)
    return {"success": True, "stats": stats}, False


# ---------------------------------------------------------------- tool_feedback

async def tool_feedback(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args: ToolFeedbackArgs = parse_arguments(ToolFeedbackArgs, arguments)
    # tool_feedback stores free text (suggestion, context, session_id, tool_name): every
    # string is screened like a write's, before suggestion / context are cut to 100 / 50.
    args = screen_args(args, res.settings.secret_policy, [])
    # The search event may still be in the deferred-effects queue: land it first.
    await res.effects.flush()
    principal: Principal = ctx.principal
    async with res.pool.acquire() as conn, conn.transaction():
        event_id = args.search_event_id
        if event_id is not None:
            exists, owner = await events_repo.search_event_owner(conn, event_id)
            if not exists:
                exists = await events_repo.ensure_search_event(conn, event_id, principal.key_id)
                owner = principal.key_id
            if not exists or (not principal.is_master and owner not in (principal.visible_key_ids or (principal.key_id,))):
                raise InvalidParams(f"Invalid params: search_event_id: no search event {event_id}")
        readable: list[str] = []
        if args.fragment_ids:
            rows = await fragments_repo.fetch_by_ids(conn, principal, list(dict.fromkeys(args.fragment_ids)))
            readable = list(rows)
        reason = args.irrelevance_reason if (not args.relevant and args.irrelevance_reason in IRRELEVANCE_REASONS) else None
        feedback_id = await events_repo.insert_tool_feedback(
            conn, key_id=principal.key_id, tool_name=args.tool_name, relevant=args.relevant,
            sufficient=args.sufficient, suggestion=args.suggestion[:100] if args.suggestion else None,
            context=args.context[:50] if args.context else None, session_id=args.session_id or ctx.session_id,
            trigger_type=args.trigger_type, irrelevance_reason=reason, search_event_id=event_id,
            fragment_ids=readable or None,
        )
        delta = FEEDBACK_ACTIVATION[(args.relevant, args.sufficient)]
        if readable:
            await events_repo.adjust_activation(conn, dict.fromkeys(readable, delta))
    return {
        "success": True,
        "id": feedback_id,
        "tool_name": args.tool_name,
        "search_event_id": event_id,
        "adjustedFragments": len(readable),
        "activationDelta": delta if readable else 0,
    }, False
