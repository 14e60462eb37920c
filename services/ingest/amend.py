"""amend: change a fragment in place (id and links kept), each change versioned; or, with
supersedes=true, replace it by a new fragment."""

from __future__ import annotations

from typing import Any

import asyncpg

from services.common.internal import ToolContext, parse_arguments
from services.ingest.feedback import attach_hint
from services.ingest.service import Screening, WriteResources
from shared.contract.write import AmendArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams
from shared.domain.keywords import merge_keywords
from shared.domain.principal import Principal
from shared.jobs import LINK_TASK, JobBuffer
from shared.repositories import case_events as case_events_repo
from shared.repositories import fragments as fragments_repo
from shared.repositories import revisions as revisions_repo

NOT_FOUND = "Fragment not found"

# seed: assertion changes on a case fragment record verification events; resolving closes it.
ASSERTION_EVENTS = {"verified": "verification_passed", "rejected": "verification_failed"}
RESOLUTION_EVENTS = {"resolved": "case_closed"}

# Fields a reply shows, by column.
SHOWN = ("id", "content", "topic", "type", "keywords", "importance", "is_anchor", "ttl_tier", "assertion_status",
         "resolution_status", "outcome", "phase", "case_id", "workspace", "valid_to", "superseded_by")


def _patch(args: AmendArgs, row: asyncpg.Record) -> dict[str, Any]:
    """The column changes the (screened) arguments ask for, against the current row (unchanged
    values dropped)."""
    wanted: dict[str, Any] = {}
    new_type = args.type or row["type"]
    if args.content is not None:
        content = args.content
        if frag.content_too_short(content):
            raise InvalidParams("Content too short: length < 10 and word count < 3")
        wanted["content"] = frag.stored_content(content, new_type)
    elif args.type is not None and args.type != row["type"]:
        wanted["content"] = frag.stored_content(row["content"], new_type)
    if args.topic is not None:
        wanted["topic"] = args.topic.strip()
    if args.type is not None:
        wanted["type"] = args.type
    content = wanted.get("content", row["content"])
    if args.keywords is not None:
        wanted["keywords"] = merge_keywords(args.keywords, content, frag.MAX_KEYWORDS)
    elif "content" in wanted and wanted["content"] != row["content"]:
        wanted["keywords"] = merge_keywords(None, content, frag.MAX_KEYWORDS)
    if args.importance is not None:
        wanted["importance"] = args.importance
    if args.isAnchor is not None:
        wanted["is_anchor"] = args.isAnchor
        if args.isAnchor:
            wanted["ttl_tier"] = "permanent"
        elif row["is_anchor"]:
            wanted["ttl_tier"] = frag.initial_ttl_tier(is_anchor=False, scope=row["scope"])
    if args.assertionStatus is not None:
        wanted["assertion_status"] = args.assertionStatus
    if args.resolutionStatus is not None:
        wanted["resolution_status"] = args.resolutionStatus
    if args.outcome is not None:
        wanted["outcome"] = args.outcome
    if args.phase is not None:
        wanted["phase"] = args.phase
    changes = {k: v for k, v in wanted.items() if _differs(row[k], v)}
    if "content" in changes:
        changes["content_hash"] = frag.content_hash(changes["content"])
    return changes


def _differs(old: Any, new: Any) -> bool:
    if isinstance(old, float) or isinstance(new, float):
        return old is None or new is None or abs(float(old) - float(new)) > 1e-6
    return old != new


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items() if k in SHOWN}


async def _case_events(conn: asyncpg.Connection, principal: Principal, row: asyncpg.Record, changes: dict[str, Any]) -> list[str]:
    case_id = row["case_id"]
    if not case_id:
        return []
    events: list[tuple[str, str]] = []
    if "assertion_status" in changes and changes["assertion_status"] in ASSERTION_EVENTS:
        summary = f"assertion {row['assertion_status']} -> {changes['assertion_status']}"
        events.append((ASSERTION_EVENTS[changes["assertion_status"]], summary))
    if "resolution_status" in changes and changes["resolution_status"] in RESOLUTION_EVENTS:
        summary = changes.get("outcome") or row["outcome"] or f"resolution {row['resolution_status']} -> resolved"
        events.append((RESOLUTION_EVENTS[changes["resolution_status"]], summary))
    for event_type, summary in events:
        await case_events_repo.record(
            conn, case_id=case_id, key_id=principal.key_id, fragment_id=row["id"], event_type=event_type, summary=summary[:500]
        )
    return [e for e, _ in events]


async def amend(res: WriteResources, jobs: JobBuffer, ctx: ToolContext, arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    args = parse_arguments(AmendArgs, arguments)
    principal = ctx.principal
    screening = Screening(res.settings)
    # Every text field (phase, agentId and id included) before anything is read or kept.
    args = screening.args(args)
    async with res.pool.acquire() as conn, conn.transaction():
        row = await revisions_repo.lock_owned(conn, principal, args.id)
        if row is None:
            # seed: another tenant's fragment is indistinguishable from a missing one.
            return {"success": False, "error": NOT_FOUND}, True
        changes = _patch(args, row)
        if "content" in changes or "topic" in changes:
            [(changes["embedding"], changes["passage_embeddings"])] = await res.embed_content(
                [(changes.get("topic", row["topic"]), changes.get("content", row["content"]))]
            )
        after = {**dict(row), **changes}
        changed = [k for k in changes if k not in ("content_hash", "embedding", "passage_embeddings")]

        if args.dryRun:
            return {"dryRun": True, "id": row["id"], "changes": changed, "supersedes": args.supersedes,
                    "before": _shown(dict(row)), "fragment": _shown(after)}, False
        if not changes and not args.supersedes:
            return {"success": True, "updated": False, "id": row["id"], "changes": []}, False

        result: dict[str, Any] = {"success": True, "updated": True, "id": row["id"], "changes": changed}
        if args.supersedes:
            # seed: supersedes=true replaces the fragment: a new one carries the patched state,
            # the old one gets valid_to, half its importance and a superseded_by link.
            new = _successor(row, changes, principal)
            await fragments_repo.insert_many(conn, [new])
            if "passage_embeddings" not in changes:  # same content: same passages
                await fragments_repo.copy_passages(conn, row["id"], new.id)
            await revisions_repo.supersede(conn, principal, new.id, [row["id"]])
            await jobs.record(conn, LINK_TASK, fragment_ids=[new.id])
            result.update(id=new.id, superseded=row["id"])
        else:
            result["version"] = await revisions_repo.record_version(conn, row, principal.key_id)
            passage_vectors = changes.pop("passage_embeddings", None)
            await revisions_repo.apply_changes(conn, row["id"], changes)
            if passage_vectors is not None:
                await fragments_repo.replace_passages(conn, [(row["id"], passage_vectors)])
        events = await _case_events(conn, principal, row, changes)
        if events:
            result["caseEvents"] = events
        if (res.settings.case_backprop_enabled and row["case_id"] and "resolution_status" in changes):
            adjusted = await revisions_repo.backprop_case(conn, principal, row["case_id"], changes["resolution_status"], row["id"])
            result["backprop"] = {"caseId": row["case_id"], "adjusted": adjusted}
    if screening.redacted:
        result["secrets_redacted"] = screening.redacted
    return await attach_hint(res, "amend", ctx.session_id, result), False


def _successor(row: asyncpg.Record, changes: dict[str, Any], principal: Principal) -> frag.NewFragment:
    state = {**dict(row), **changes}
    return frag.NewFragment(
        id=frag.new_fragment_id(), content=state["content"], topic=state["topic"], type=state["type"],
        keywords=list(state["keywords"]), importance=float(state["importance"]), content_hash=state["content_hash"],
        embedding=state["embedding"], passage_embeddings=state.get("passage_embeddings"),
        source=state["source"], scope=state["scope"], is_anchor=state["is_anchor"],
        ttl_tier=state["ttl_tier"], key_id=row["key_id"], workspace=state["workspace"],
        workspace_source=state["workspace_source"], agent_id=state["agent_id"], session_id=state["session_id"],
        case_id=state["case_id"], goal=state["goal"], outcome=state["outcome"], phase=state["phase"],
        resolution_status=state["resolution_status"], assertion_status=state["assertion_status"],
        affect=state["affect"], context_summary=state["context_summary"],
    )
