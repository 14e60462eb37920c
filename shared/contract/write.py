"""Tool arguments of the write path, as the reference names them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from shared.contract.base import Id, Keyword, Label, ToolArgs
from shared.contract.spec import ToolSpec
from shared.domain.fragment import (
    MAX_CONTENT_CHARS,
    MAX_IDEMPOTENCY_KEY,
    MAX_LABEL_CHARS,
    MAX_LIST_ITEMS,
    MAX_SUMMARY_CHARS,
)

FragmentTypeArg = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]


class RememberArgs(ToolArgs):
    """Store one atomic memory fragment."""

    content: str = Field(max_length=MAX_CONTENT_CHARS)
    topic: str = Field(min_length=1, max_length=MAX_LABEL_CHARS)
    type: FragmentTypeArg
    keywords: list[Keyword] | None = Field(None, max_length=50)
    importance: float | None = Field(None, ge=0, le=1)
    source: Label | None = None
    linkedTo: list[Id] | None = Field(None, max_length=MAX_LIST_ITEMS)
    scope: Literal["permanent", "session"] = "permanent"
    isAnchor: bool = False
    supersedes: list[Id] | None = Field(None, max_length=MAX_LIST_ITEMS)
    contextSummary: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)
    sessionId: Id | None = None
    workspace: Label | None = None
    agentId: Id | None = None
    caseId: Id | None = None
    goal: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)
    outcome: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)
    phase: Label | None = None
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = None
    assertionStatus: Literal["observed", "inferred", "verified", "rejected"] = "observed"
    affect: Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"] = "neutral"
    idempotencyKey: str | None = Field(None, max_length=MAX_IDEMPOTENCY_KEY)
    dryRun: bool = False


# seed: at most 200 fragments per batch_remember call.
MAX_BATCH = 200


class BatchRememberArgs(ToolArgs):
    # Items are validated one by one (each failure is reported in results[i]), so they
    # arrive here as plain objects.
    fragments: list[dict] = Field(min_length=1, max_length=MAX_BATCH)
    workspace: Label | None = None
    agentId: Id | None = None
    stream: bool | None = None
    async_: bool = Field(False, alias="async")


class ForgetArgs(ToolArgs):
    id: Id | None = None
    topic: Label | None = None
    force: bool = False
    agentId: Id | None = None
    dryRun: bool = False


class BatchStatusArgs(ToolArgs):
    jobId: str = Field(min_length=1, max_length=64)


AmendTypeArg = Literal["fact", "decision", "error", "preference", "procedure", "relation"]


class AmendArgs(ToolArgs):
    id: Id
    content: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    topic: str | None = Field(None, min_length=1, max_length=MAX_LABEL_CHARS)
    keywords: list[Keyword] | None = Field(None, max_length=50)
    type: AmendTypeArg | None = None
    importance: float | None = Field(None, ge=0, le=1)
    isAnchor: bool | None = None
    supersedes: bool = False
    assertionStatus: Literal["observed", "inferred", "verified", "rejected"] | None = None
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = None
    outcome: str | None = Field(None, max_length=MAX_SUMMARY_CHARS)
    phase: Label | None = None
    agentId: Id | None = None
    dryRun: bool = False


class LinkArgs(ToolArgs):
    fromId: Id
    toId: Id
    relationType: Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"] = "related"
    agentId: Id | None = None
    weight: float = Field(1.0, ge=0, le=1)
    dryRun: bool = False


class TaskEffectivenessArg(ToolArgs):
    # Lenient on purpose: seed says an outcome outside the enum is stored as NULL, not refused.
    outcome: Label | None = Field(None, description="completed | partial | blocked | abandoned | unknown")
    evaluator: Label | None = Field(None, description="agent | automatic | human (default agent)")
    evidence: str | None = None
    unmet_requirements: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    overall_success: bool | None = None
    tool_highlights: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    tool_pain_points: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)


class ReflectArgs(ToolArgs):
    summary: str | Annotated[list[str], Field(max_length=MAX_LIST_ITEMS)] | None = None
    sessionId: Id | None = None
    decisions: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    errors_resolved: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    new_procedures: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    open_questions: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS)
    narrative_summary: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    agentId: Id | None = None
    workspace: Label | None = None
    task_effectiveness: TaskEffectivenessArg | None = None


WRITE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Store one atomic memory fragment (1-3 sentences, one fact/decision/error/preference/"
        "procedure/relation/episode). Content over 4000 characters is refused; non-episode content "
        "is cut at 300 characters. Secrets (passwords, tokens, API or private keys) are never stored.",
        RememberArgs, "ingest", ("store", "dedup", "supersede", "link", "dryRun", "idempotency"), "write", False,
    ),
    ToolSpec(
        "batch_remember",
        "Store up to 200 fragments in one transaction; results[i] answers fragments[i]. "
        "async=true queues them and returns a jobId for batch_status.",
        BatchRememberArgs, "ingest", ("store", "batch", "async"), "write", False,
    ),
    ToolSpec(
        "batch_status",
        "State of an async batch_remember job: queued, processing, completed or dead, with counts.",
        BatchStatusArgs, "ingest", ("status", "batch"), "read", True,
    ),
    ToolSpec(
        "forget",
        "Delete a fragment by id, or all fragments of a topic. Permanent-tier fragments need force.",
        ForgetArgs, "ingest", ("delete", "dryRun"), "write", False,
    ),
    ToolSpec(
        "amend",
        "Update a fragment's content or metadata in place, keeping its id and links; every change "
        "keeps the previous state as a version. supersedes=true replaces it with a new fragment.",
        AmendArgs, "ingest", ("update", "version", "supersede", "dryRun"), "write", False,
    ),
    ToolSpec(
        "link",
        "Relate two fragments (related, caused_by, resolved_by, part_of, contradicts) with a weight; "
        "refuses cycles of directed relations.",
        LinkArgs, "ingest", ("link", "graph", "dryRun"), "write", True,
    ),
    ToolSpec(
        "reflect",
        "Persist what a session learned: each summary / decision / resolved error / procedure / open "
        "question becomes one fragment, plus an episode narrative; with sessionId, per workspace, case "
        "and topic group.",
        ReflectArgs, "ingest", ("store", "reflect", "session", "taskFeedback"), "write", False,
    ),
)
