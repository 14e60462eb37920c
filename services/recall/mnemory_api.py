"""The mnemory REST surface's reads (reference 004), as internal tools of recall: search,
find (multi-query), core, recent, list, by-ids, categories, session summaries.

Search ranks by the cosine of the query's MiniLM embedding (what reference 004's scores
and score_threshold are: a 0-1 similarity), over the caller's live memories with the
reference's filters applied inside the query."""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
from fastapi import Request

from services.common.internal import ToolContext, parse_arguments
from services.recall.service import ReadResources
from shared.contract.mnemory import (
    CoreArgs,
    FindMemoriesRequest,
    GetMemoriesByIdsRequest,
    ListMemoriesArgs,
    RecentArgs,
    SearchMemoriesRequest,
    SessionArgs,
    SessionListArgs,
)
from shared.domain import mnemory as model
from shared.domain.keywords import extract_keywords
from shared.llm import LLMClient, LLMSettings
from shared.repositories import mnemory_memories as repo
from shared.repositories import mnemory_sessions as sessions_repo
from shared.repositories.mnemory_memories import MemoryFilter
from shared.settings import MnemorySettings

logger = logging.getLogger(__name__)
ToolResult = tuple[dict[str, Any], bool]

# Core context (reference 004 get_core_memories): non-pinned memories of at least this
# importance join the pinned ones, this many per scope; each section holds at most
# CORE_MAX_PER_SECTION; recent lines are dropped (least important first) past CORE_MAX_CHARS.
CORE_TOP_N = 10
CORE_MIN_IMPORTANCE = "high"
CORE_MAX_PER_SECTION = 20
CORE_MAX_CHARS = 8000
RECENT_LIMIT = 25
# reference 004: the recent section of core context holds what happened, not standing facts
# (those are the main sections' when pinned or important, and search's otherwise).
RECENT_MEMORY_TYPES = ("episodic", "context", "procedural")
SECTION_LABELS = {
    "agent_identity": "Agent Identity",
    "agent_knowledge": "Agent Knowledge",
    "agent_instructions": "Agent Instructions",
    "user_facts": "User Facts",
    "user_preferences": "User Preferences",
    "other_user_memories": "Other User Memories",
    "recent_user_activity": "User Activity",
    "recent_agent_activity": "Agent Activity",
}
SECTION_ORDER = list(SECTION_LABELS)
_MAIN_HEADINGS = {key: f"## {label}" for key, label in SECTION_LABELS.items() if not key.startswith("recent_")}
# How much more than `limit` each sub-query of find fetches before the results are merged.
FIND_DEPTH = 2
_FIND_SYSTEM = (
    "You turn a question about a user's stored memories into search queries. Answer with at most {n} "
    "short search queries, one per line, nothing else. Cover different phrasings and the facts the "
    "answer depends on."
)


# Read once per process: settings are the environment's, which does not change under it.
_settings = functools.cache(MnemorySettings)
_llm = functools.cache(lambda: LLMClient(LLMSettings()))


def failure(message: str, status: int = 400) -> ToolResult:
    return {"error": True, "message": message, "status": status}, True


def _line(text: str) -> str:
    """A memory as one line of injected context: no newline may start a forged heading."""
    return " ".join(text.split())


def _date_bound(value: str | None, field: str, *, end: bool) -> datetime | None:
    if not value:
        return None
    try:
        day = datetime.fromisoformat(value.strip()[:10]).replace(tzinfo=UTC)
    except ValueError:
        raise model.ModelError(f"{field}: expected YYYY-MM-DD, got {value!r}") from None
    return day + timedelta(days=1) if end else day


def _filter(args: Any, **extra: Any) -> MemoryFilter:
    memory_type = getattr(args, "memory_type", None)
    categories = getattr(args, "categories", None)
    role = getattr(args, "role", None)
    if role is not None and role not in model.ROLES:
        raise model.ModelError(f"Unknown role '{role}'. Valid roles: user, assistant")
    return MemoryFilter(
        agent_id=args.caller_agent_id,
        memory_types=(model.validate_memory_type(memory_type),) if memory_type else None,
        categories=tuple(model.validate_categories(categories)) if categories else None,
        role=role,
        labels=model.validate_labels(getattr(args, "labels", None)) or None,
        include_decayed=getattr(args, "include_decayed", False),
        **extra,
    )


async def _search_rows(
    res: ReadResources, ctx: ToolContext, flt: MemoryFilter, query: str, limit: int, min_score: float
) -> list[tuple[asyncpg.Record, float]]:
    vector = await res.embed_query(query)
    async with res.pool.acquire() as conn:
        return await repo.search(conn, ctx.principal, flt, vector, limit, min_score)


def _min_score(requested: float | None) -> float:
    server = _settings().search_score_threshold
    return max(server, requested) if requested is not None else server


async def search(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(SearchMemoriesRequest, arguments)
    try:
        flt = _filter(
            args, date_start=_date_bound(args.date_start, "date_start", end=False),
            date_end=_date_bound(args.date_end, "date_end", end=True),
        )
    except model.ModelError as exc:
        return failure(str(exc), 422)
    rows = await _search_rows(res, ctx, flt, args.query, args.limit, _min_score(args.score_threshold))
    return {"results": [model.memory_item(r, s) for r, s in rows]}, False


def fallback_queries(question: str, context: str | None, limit: int) -> list[str]:
    """Sub-queries without an LLM: the question, its keywords alone (a shorter query weighs
    the content words), each of its sentences, and the question in its context."""
    queries = [question.strip()]
    keywords = extract_keywords(question, 8)
    if keywords:
        queries.append(" ".join(keywords))
    parts = [p.strip() for p in question.replace("?", "?\n").replace(". ", ".\n").splitlines() if len(p.strip()) > 8]
    if len(parts) > 1:
        queries.extend(parts)
    if context:
        queries.append(f"{context.strip()} {question.strip()}")
    return list(dict.fromkeys(q for q in queries if q))[:limit]


def _llm_queries(question: str, context: str | None, limit: int) -> list[str] | None:
    llm = _llm()
    if not llm.configured:
        return None
    prompt = question if not context else f"Context: {context}\nQuestion: {question}"
    answer = llm.complete(_FIND_SYSTEM.format(n=limit), prompt, llm.budget(), max_tokens=200)
    if not answer:
        return None
    lines = [line.strip().lstrip("-*0123456789. ").strip() for line in answer.splitlines()]
    return list(dict.fromkeys([question.strip(), *(line for line in lines if line)]))[:limit]


async def find(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """Multi-query search: sub-queries from the LLM when one is configured (LLM_BASE_URL,
    LLM_MODEL), else fallback_queries; each searched, a memory scored by its best match."""
    args = parse_arguments(FindMemoriesRequest, arguments)
    try:
        flt = _filter(args)
    except model.ModelError as exc:
        return failure(str(exc), 422)
    max_queries = _settings().find_max_queries
    queries = await anyio.to_thread.run_sync(_llm_queries, args.question, args.context, max_queries)
    mode = "llm"
    if not queries:
        queries, mode = fallback_queries(args.question, args.context, max_queries), "fallback"
    best: dict[str, tuple[asyncpg.Record, float]] = {}
    for query in queries:
        for row, score in await _search_rows(res, ctx, flt, query, args.limit * FIND_DEPTH, _min_score(None)):
            if row["id"] not in best or score > best[row["id"]][1]:
                best[row["id"]] = (row, score)
    ranked = sorted(best.values(), key=lambda pair: pair[1], reverse=True)[: args.limit]
    return {"results": [model.memory_item(r, s) for r, s in ranked], "queries": queries, "query_mode": mode}, False


def _agent_section(row: asyncpg.Record) -> str:
    memory_type = model.memory_type_of(row["type"], row["memory_type"])
    if (row["role"] or "user") == "assistant":
        return "agent_identity" if memory_type in ("preference", "fact") else "agent_knowledge"
    return "agent_instructions"


def _user_section(row: asyncpg.Record) -> str:
    memory_type = model.memory_type_of(row["type"], row["memory_type"])
    return {"fact": "user_facts", "preference": "user_preferences"}.get(memory_type, "other_user_memories")


def _recent_line(row: asyncpg.Record) -> str:
    categories = list(row["categories"] or [])
    tags = f" [{', '.join(categories)}]" if categories else ""
    return f"- [{row['created_at'].date().isoformat()}]{tags} {_line(row['content'])}"


def _recent_text(title: str, user: list[str], agent: list[str]) -> str:
    if not user and not agent:
        return ""
    parts = [title]
    if user:
        parts.extend(["\n### User Activity", *user])
    if agent:
        parts.extend(["\n### Agent Activity", *agent])
    return "\n".join(parts)


async def core(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """Pinned + top important + recent memories as sectioned markdown; raw-layer memories are
    left out unless include_raw. `memory_ids` (all included) is for /api/recall's session."""
    args = parse_arguments(CoreArgs, arguments)
    agent = args.caller_agent_id
    exclude = () if args.include_raw else ("raw",)
    since = datetime.now(UTC) - timedelta(days=args.recent_days)
    async with res.pool.acquire() as conn:
        pinned = await repo.list_memories(conn, ctx.principal, MemoryFilter(agent_id=agent, exclude_layers=exclude, pinned=True),
                                          CORE_MAX_PER_SECTION * 6, by_importance=True)
        top = await repo.list_memories(conn, ctx.principal, MemoryFilter(
            agent_id=agent, exclude_layers=exclude, pinned=False, min_importance=CORE_MIN_IMPORTANCE), CORE_TOP_N * 3, by_importance=True)
        recent = await repo.list_memories(conn, ctx.principal, MemoryFilter(
            agent_id=agent, exclude_layers=exclude, since=since, memory_types=RECENT_MEMORY_TYPES), RECENT_LIMIT * 4)
    sections: dict[str, list[asyncpg.Record]] = {key: [] for key in SECTION_ORDER}
    taken: set[str] = set()

    def place(rows: list[asyncpg.Record], cap: int | None) -> None:
        count = {"agent": 0, "user": 0}
        for row in rows:
            is_agent = bool(agent) and row["agent_id"] == agent
            scope = "agent" if is_agent else "user"
            if row["id"] in taken or (cap is not None and count[scope] >= cap):
                continue
            key = _agent_section(row) if is_agent else _user_section(row)
            if len(sections[key]) >= CORE_MAX_PER_SECTION:
                continue
            sections[key].append(row)
            taken.add(row["id"])
            count[scope] += 1

    place(list(pinned), None)
    place(list(top), CORE_TOP_N)
    for row in recent:  # newest first; what a main section already holds is not repeated
        if row["id"] in taken:
            continue
        key = "recent_agent_activity" if agent and row["agent_id"] == agent else "recent_user_activity"
        if len(sections[key]) < RECENT_LIMIT:
            sections[key].append(row)
            taken.add(row["id"])
    main = "\n\n".join(
        heading + "\n" + "\n".join(f"- {_line(r['content'])}" for r in sections[key])
        for key, heading in _MAIN_HEADINGS.items() if sections[key]
    )

    def assemble() -> str:
        recent_text = _recent_text(
            "## Recent Context", [_recent_line(r) for r in sections["recent_user_activity"]],
            [_recent_line(r) for r in sections["recent_agent_activity"]],
        )
        return "\n\n".join(p for p in (main, recent_text) if p)

    text = assemble()
    for key in ("recent_agent_activity", "recent_user_activity"):  # trimmed from the end, agent lines first
        while len(text) > CORE_MAX_CHARS and sections[key]:
            sections[key].pop()
            text = assemble()
    visible = {key: [r["id"] for r in rows] for key, rows in sections.items() if rows}
    memory_ids = [mid for key in SECTION_ORDER for mid in visible.get(key, [])]
    reply: dict[str, Any] = {"text": text or "No core memories found.", "memory_ids": memory_ids}
    if args.include_stats:
        reply["stats"] = _core_stats(text, sections, visible, memory_ids)
    return reply, False


def _core_stats(
    text: str, sections: dict[str, list[asyncpg.Record]], visible: dict[str, list[str]], memory_ids: list[str]
) -> dict[str, Any]:
    if not memory_ids:
        return {
            "memory_count": 0, "char_count": 0, "estimated_tokens": 0, "by_type": {}, "by_role": {},
            "by_section": dict.fromkeys(SECTION_ORDER, 0), "section_labels": dict(SECTION_LABELS),
            "sections": {key: [] for key in SECTION_ORDER}, "memory_ids": [],
        }
    by_type: dict[str, int] = {}
    by_role: dict[str, int] = {}
    for rows in sections.values():
        for row in rows:
            memory_type = model.memory_type_of(row["type"], row["memory_type"])
            by_type[memory_type] = by_type.get(memory_type, 0) + 1
            role = row["role"] or "user"
            by_role[role] = by_role.get(role, 0) + 1
    return {
        "memory_count": len(memory_ids),
        "char_count": len(text),
        "estimated_tokens": max(1, (len(text) + 3) // 4),
        "by_type": by_type,
        "by_role": by_role,
        "by_section": {key: len(visible[key]) for key in SECTION_ORDER if key in visible},
        "section_labels": {key: SECTION_LABELS[key] for key in SECTION_ORDER if key in visible},
        "sections": visible,
        "memory_ids": memory_ids,
    }


async def recent(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(RecentArgs, arguments)
    agent = args.caller_agent_id
    if args.scope == "agent" and not agent:
        return failure("agent_id is required when scope='agent'", 422)
    since = datetime.now(UTC) - timedelta(days=args.days)
    user_rows: list[asyncpg.Record] = []
    agent_rows: list[asyncpg.Record] = []
    async with res.pool.acquire() as conn:
        if args.scope in ("all", "user"):
            rows = await repo.list_memories(conn, ctx.principal, MemoryFilter(
                agent_id=agent, since=since, include_decayed=args.include_decayed), args.limit * 2)
            user_rows = [r for r in rows if not agent or r["agent_id"] != agent][: args.limit]
        if args.scope in ("all", "agent") and agent:
            rows = await repo.list_memories(conn, ctx.principal, MemoryFilter(
                agent_id=agent, since=since, include_decayed=args.include_decayed), args.limit * 2)
            agent_rows = [r for r in rows if r["agent_id"] == agent][: args.limit]
    text = _recent_text("## Recent Memories", [_recent_line(r) for r in user_rows], [_recent_line(r) for r in agent_rows])
    return {"text": text or "No recent memories found."}, False


async def list_memories(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(ListMemoriesArgs, arguments)
    try:
        flt = _filter(args, memory_layer=args.memory_layer)
    except model.ModelError as exc:
        return failure(str(exc), 422)
    async with res.pool.acquire() as conn:
        rows = await repo.list_memories(conn, ctx.principal, flt, args.limit, newest_first=args.sort != "oldest")
    return {"results": [model.memory_item(r) for r in rows]}, False


async def by_ids(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(GetMemoriesByIdsRequest, arguments)
    async with res.pool.acquire() as conn:
        rows = await repo.by_ids(conn, ctx.principal, list(args.ids))
    return {"results": [model.memory_item(r) for r in rows]}, False


async def categories(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    async with res.pool.acquire() as conn:
        counts, total = await repo.category_counts(conn, ctx.principal)
    out = []
    for name, description in model.PREDEFINED_CATEGORIES.items():
        count = counts.get(name, 0) + sum(n for c, n in counts.items() if c.startswith(name + ":"))
        out.append({"name": name, "description": description, "count": count})
    for name, count in sorted(counts.items()):
        prefix = name.split(":", 1)[0]
        if ":" in name and prefix in model.PREDEFINED_CATEGORIES:
            out.append({"name": name, "description": f"{model.PREDEFINED_CATEGORIES[prefix]} (subcategory)", "count": count})
    return {"categories": out, "total_memories": total}, False


async def sessions_list(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(SessionListArgs, arguments)
    async with res.pool.acquire() as conn:
        rows, total, truncated = await sessions_repo.list_summaries(
            conn, ctx.principal, offset=args.offset, limit=args.limit, state=args.consolidation_state, q=args.q,
            sort_by=args.sort_by, sort_dir=args.sort_dir,
        )
    return {
        "sessions": [sessions_repo.summary_to_wire(r, full=False) for r in rows],
        "total": total, "offset": args.offset, "limit": args.limit,
        "has_more": args.offset + len(rows) < total or truncated, "total_truncated": truncated,
    }, False


async def session_get(res: ReadResources, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    args = parse_arguments(SessionArgs, arguments)
    async with res.pool.acquire() as conn:
        row = await sessions_repo.get_summary(conn, ctx.principal, args.session_id)
    if row is None:
        return failure("Session not found", 404)
    return sessions_repo.summary_to_wire(row, full=True), False


def _handler(fn: Any) -> Any:
    async def handle(request: Request, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        result: ToolResult = await fn(request.app.state.resources, ctx, arguments)
        return result

    return handle


TOOL_HANDLERS = {
    "mnemory_search": _handler(search),
    "mnemory_find": _handler(find),
    "mnemory_core": _handler(core),
    "mnemory_recent": _handler(recent),
    "mnemory_list": _handler(list_memories),
    "mnemory_by_ids": _handler(by_ids),
    "mnemory_categories": _handler(categories),
    "mnemory_sessions": _handler(sessions_list),
    "mnemory_session": _handler(session_get),
}
