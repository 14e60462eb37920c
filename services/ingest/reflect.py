"""reflect: a session's lessons, one fragment per item, persisted per workspace / case /
topic group of the session (seed: reflect)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.internal import ToolContext, parse_arguments
from services.ingest import batch
from services.ingest.service import Screening, WriteResources, build_fragment
from shared.contract.write import ReflectArgs, RememberArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams
from shared.domain.reflection import CATEGORIES, REFLECT_TOPIC, narrative_from_summary, normalise_task_effectiveness
from shared.jobs import LINK_TASK, JobBuffer
from shared.repositories import reflections as reflections_repo
from shared.repositories import task_feedback as task_feedback_repo


@dataclass
class Group:
    workspace: str | None
    case_id: str | None
    topic: str
    contents: list[str] = field(default_factory=list)
    # (category breakdown key or None for a synthesised episode, fragment)
    planned: list[tuple[str | None, frag.NewFragment]] = field(default_factory=list)


def _items(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    return [v.strip() for v in value if v and v.strip()]


def _synthesised(group: Group, session_id: str) -> str:
    head = f"Session {session_id} worked on {group.topic}"
    if group.case_id and group.case_id != session_id:
        head += f" (case {group.case_id})"
    return head + ": " + " ".join(c.strip().rstrip(".") + "." for c in group.contents)


async def reflect(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(ReflectArgs, arguments)
    # All of it up front: sessionId and task_effectiveness are stored outside the fragments.
    args = Screening(res.settings).args(args)
    principal = ctx.principal
    session_id = args.sessionId or ctx.session_id
    summary = _items(args.summary)
    narrative = (args.narrative_summary or "").strip() or narrative_from_summary(summary)

    async with res.pool.acquire() as conn:
        rows = await reflections_repo.session_groups(conn, principal, args.sessionId, REFLECT_TOPIC) if args.sessionId else []
    groups = [Group(r["workspace"], r["case_id"], r["topic"], list(r["contents"])) for r in rows]
    if not groups:
        # seed legacy path: the arguments themselves are one group.
        groups = [Group(None, session_id, REFLECT_TOPIC)]

    def plan(group: Group, category: str | None, ftype: str, content: str, keywords: list[str]) -> None:
        # seed workspace precedence: the argument, else the group's own, else the key default, else NULL.
        parsed = RememberArgs(
            content=content[: frag.MAX_CONTENT_CHARS], topic=REFLECT_TOPIC, type=ftype,
            keywords=keywords, workspace=args.workspace or group.workspace, sessionId=session_id,
            caseId=group.case_id, agentId=args.agentId, source="reflect",
        )
        try:
            group.planned.append((category, build_fragment(parsed, ctx, res.settings)))
        except InvalidParams as exc:
            if exc.data and exc.data.get("secretKinds"):
                raise InvalidParams(f"{category or 'narrative_summary'}: {exc.message}", exc.data) from None
            skipped.append({"category": category or "episode", "content": content[:80], "error": exc.message})

    skipped: list[dict[str, Any]] = []
    primary = groups[0]
    for name, ftype, key in CATEGORIES:
        values = summary if name == "summary" else _items(getattr(args, name))
        for value in values:
            plan(primary, key, ftype, value, ["open_question"] if name == "open_questions" else [])
    if narrative:
        plan(primary, "episode", "episode", narrative, ["session_narrative"])
    for group in groups[1:] if args.sessionId else []:
        plan(group, None, "episode", _synthesised(group, args.sessionId or ""), ["session_reflect"])

    flat = [(g, category, f) for g in groups for category, f in g.planned]
    results: list[dict[str, Any] | None] = [None] * len(flat)
    planned: batch.Planned = [(i, f, None) for i, (_, _, f) in enumerate(flat)]
    task_feedback_id = None
    if planned:
        await res.embed_fragments([f for _, f, _ in planned])
    async with res.pool.acquire() as conn, conn.transaction():
        inserted = await batch._store(conn, principal, planned, results) if planned else []
        if inserted:
            await jobs.record(conn, LINK_TASK, fragment_ids=inserted)
        if args.task_effectiveness is not None:
            task = normalise_task_effectiveness(args.task_effectiveness.model_dump())
            task_feedback_id = await task_feedback_repo.insert(conn, key_id=principal.key_id, session_id=session_id, task=task)

    fragments: list[dict[str, Any]] = []
    breakdown: dict[str, int] = {"summary": 0, "decisions": 0, "errors": 0, "procedures": 0, "questions": 0}
    group_ids: dict[int, list[str]] = {id(g): [] for g in groups}
    for (group, category, f), result in zip(flat, results, strict=True):
        if not result or not result["success"]:
            skipped.append({"category": category or "episode", "content": f.content[:80], "error": (result or {}).get("error")})
            continue
        fragments.append({"id": result["id"], "content": f.content, "type": f.type, "keywords": f.keywords,
                          **({"duplicate": True} if result.get("duplicate") else {})})
        group_ids[id(group)].append(result["id"])
        if category is not None:
            breakdown[category] = breakdown.get(category, 0) + 1
    reply: dict[str, Any] = {"count": len(fragments), "fragments": fragments, "breakdown": breakdown}
    if args.sessionId:
        reply["groups"] = [
            {"workspace": args.workspace or g.workspace or principal.default_workspace, "topic": g.topic,
             "caseId": g.case_id, "fragmentIds": group_ids[id(g)]}
            for g in groups
        ]
    if task_feedback_id is not None:
        reply["task_effectiveness"] = {"recorded": True, "id": task_feedback_id}
    if skipped:
        reply["skipped"] = skipped
    return reply, False
