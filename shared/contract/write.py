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


_TYPES = "fact, decision, error, preference, procedure, relation, episode"
_AGENT = "Agent id: isolates one agent's fragments within the key (default: the key's own agent)."
_DRY_RUN = "true: change nothing and return what would happen (default false)."


class RememberArgs(ToolArgs):
    """Store one atomic memory fragment."""

    content: str = Field(
        max_length=MAX_CONTENT_CHARS,
        description="What to remember: one fact, 1-3 sentences, best under 300 characters (types other than "
        "episode are cut at 300; over 4000 is refused with -32602).",
    )
    topic: str = Field(min_length=1, max_length=MAX_LABEL_CHARS, description="Topic, e.g. database, email, deployment, security.")
    type: FragmentTypeArg = Field(description=f"Fragment type: {_TYPES}.")
    keywords: list[Keyword] | None = Field(
        None, max_length=50,
        description="Search keywords; merged before the ones extracted from the content (deduplicated, at most 10).")
    importance: float | None = Field(None, ge=0, le=1, description="Importance 0-1 (default by type: error 0.8 ... episode 0.4).")
    source: Label | None = Field(None, description="Where it came from (a session id, a tool name...).")
    linkedTo: list[Id] | None = Field(None, max_length=MAX_LIST_ITEMS, description="Ids of existing fragments to link this one to.")
    scope: Literal["permanent", "session"] = Field(
        "permanent", description="permanent: long-term memory (default); session: working memory gone when the session ends.")
    isAnchor: bool = Field(False, description="Pin it: true exempts it from importance decay and expiry (default false).")
    supersedes: list[Id] | None = Field(
        None, max_length=MAX_LIST_ITEMS,
        description="Ids of fragments this one replaces: they expire (valid_to) and lose half their importance.")
    contextSummary: str | None = Field(
        None, max_length=MAX_SUMMARY_CHARS, description="The background this memory came from (1-2 sentences); returned by recall.")
    sessionId: Id | None = Field(None, description="Current session id (default the MCP session); bundles the session's fragments in time.")
    workspace: Label | None = Field(None, description="Workspace name; default the key's default workspace.")
    agentId: Id | None = Field(None, description=_AGENT)
    caseId: Id | None = Field(None, description="Task/case id this fragment belongs to; default the session id.")
    goal: str | None = Field(None, max_length=MAX_SUMMARY_CHARS, description="The goal of an episode (for type episode).")
    outcome: str | None = Field(None, max_length=MAX_SUMMARY_CHARS, description="The outcome of an episode.")
    phase: Label | None = Field(None, description="Work phase, e.g. planning, debugging, verification.")
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = Field(
        None, description="Resolution of the task: open, resolved, abandoned.")
    assertionStatus: Literal["observed", "inferred", "verified", "rejected"] = Field(
        "observed", description="How sure it is: observed (default), inferred, verified, rejected.")
    affect: Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"] = Field(
        "neutral", description="Emotional tag at the time: neutral (default), frustration, confidence, surprise, doubt, satisfaction.")
    idempotencyKey: str | None = Field(
        None, max_length=MAX_IDEMPOTENCY_KEY,
        description="Retry-safe id (at most 128 characters): a repeat with the same value for this key returns the first "
        "fragment's id with idempotent=true instead of storing again.")
    dryRun: bool = Field(False, description="true: store nothing; return the fragment, conflicts, warnings and quota it would have.")


# seed: at most 200 fragments per batch_remember call.
MAX_BATCH = 200


class BatchRememberArgs(ToolArgs):
    # Items are validated one by one (each failure is reported in results[i]), so they
    # arrive here as plain objects.
    fragments: list[dict] = Field(
        min_length=1, max_length=MAX_BATCH,
        description="Fragments to store (at most 200), each an object like remember's arguments: content (required, at most "
        "4000 characters), topic (required), type (required), importance, keywords, workspace, idempotencyKey.",
    )
    workspace: Label | None = Field(None, description="Default workspace of items without one; default the key's default workspace.")
    agentId: Id | None = Field(None, description=_AGENT)
    stream: bool | None = Field(None, description="Deprecated, no effect (kept for compatibility).")
    async_: bool = Field(
        False, alias="async",
        description="true: validate now, store in the background, return {async, accepted, rejected, jobId} at once (default false).")


class ForgetArgs(ToolArgs):
    id: Id | None = Field(None, description="Id of the fragment to delete (give id or topic).")
    topic: Label | None = Field(None, description="Delete every fragment of this topic.")
    force: bool = Field(False, description="Also delete permanent-tier fragments (default false).")
    agentId: Id | None = Field(None, description=_AGENT)
    dryRun: bool = Field(False, description="true: delete nothing; return what would be deleted and its link count.")


class BatchStatusArgs(ToolArgs):
    jobId: str = Field(min_length=1, max_length=64, description="The jobId batch_remember(async: true) returned.")


AmendTypeArg = Literal["fact", "decision", "error", "preference", "procedure", "relation"]


class AmendArgs(ToolArgs):
    id: Id = Field(description="Id of the fragment to update.")
    content: str | None = Field(
        None, max_length=MAX_CONTENT_CHARS, description="New content (cut at 300 characters; over 4000 is refused with -32602).")
    topic: str | None = Field(None, min_length=1, max_length=MAX_LABEL_CHARS, description="New topic.")
    keywords: list[Keyword] | None = Field(None, max_length=50, description="New keyword list.")
    type: AmendTypeArg | None = Field(None, description="New type: fact, decision, error, preference, procedure, relation.")
    importance: float | None = Field(None, ge=0, le=1, description="New importance (0-1).")
    isAnchor: bool | None = Field(None, description="Pin (true) or unpin (false) the fragment.")
    supersedes: bool = Field(
        False, description="true: store the change as a new fragment that supersedes this one (superseded_by link, lower importance).")
    assertionStatus: Literal["observed", "inferred", "verified", "rejected"] | None = Field(
        None, description="New confidence: observed, inferred, verified, rejected (records a verification event on a case).")
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = Field(
        None, description="New resolution: open, resolved, abandoned (resolved records case_closed on a case).")
    outcome: str | None = Field(None, max_length=MAX_SUMMARY_CHARS, description="How the case ended; send with resolutionStatus=resolved.")
    phase: Label | None = Field(None, description="New work phase (planning, debugging, implementation, verification...).")
    agentId: Id | None = Field(None, description=_AGENT)
    dryRun: bool = Field(False, description="true: change nothing; return the fragment as it would be after the patch.")


class LinkArgs(ToolArgs):
    fromId: Id = Field(description="Id of the fragment the link starts from.")
    toId: Id = Field(description="Id of the fragment the link points to.")
    relationType: Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"] = Field(
        "related", description="Relation: related (default), caused_by, resolved_by, part_of, contradicts.")
    agentId: Id | None = Field(None, description=_AGENT)
    weight: float = Field(1.0, ge=0, le=1, description="Strength of the relation, 0-1 (default 1).")
    dryRun: bool = Field(False, description="true: create nothing; return the cycle and ownership checks only.")


class TaskEffectivenessArg(ToolArgs):
    # Lenient on purpose: seed says an outcome outside the enum is stored as NULL, not refused.
    outcome: Label | None = Field(
        None, description="How the task ended: completed | partial | blocked | abandoned | unknown (unknown when unsure).")
    evaluator: Label | None = Field(None, description="Who judged the outcome: agent | automatic | human (default agent).")
    evidence: str | None = Field(None, description="Why that outcome (over 1000 characters is cut).")
    unmet_requirements: list[str] | None = Field(
        None, max_length=MAX_LIST_ITEMS, description="Requirements not met (at most 20, each cut at 200 characters).")
    overall_success: bool | None = Field(None, description="Compatibility field; default true when outcome is completed.")
    tool_highlights: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS, description="Tools that helped.")
    tool_pain_points: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS, description="Tools that got in the way.")


_ONE_EACH = "one item per fragment"


class ReflectArgs(ToolArgs):
    summary: str | Annotated[list[str], Field(max_length=MAX_LIST_ITEMS)] | None = Field(
        None, description=f"Session overview facts, a list preferred ({_ONE_EACH}, 1-2 sentences each).")
    sessionId: Id | None = Field(None, description="Session to reflect: its fragments are summarised by workspace, case and topic.")
    decisions: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS, description=f"Technical decisions made ({_ONE_EACH}).")
    errors_resolved: list[str] | None = Field(
        None, max_length=MAX_LIST_ITEMS, description=f"Errors resolved, best as 'cause: X -> fix: Y' ({_ONE_EACH}).")
    new_procedures: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS, description=f"Procedures established ({_ONE_EACH}).")
    open_questions: list[str] | None = Field(None, max_length=MAX_LIST_ITEMS, description=f"Questions still open ({_ONE_EACH}).")
    narrative_summary: str | None = Field(
        None, max_length=MAX_CONTENT_CHARS, description="The session told in 3-5 sentences, stored as an episode; default from summary.")
    agentId: Id | None = Field(None, description=_AGENT)
    workspace: Label | None = Field(
        None, description="Workspace of every fragment written; default each group's own, then the key's default.")
    task_effectiveness: TaskEffectivenessArg | None = Field(
        None, description="How the task went and which tools helped: outcome, evaluator, evidence, unmet_requirements, ...")


WRITE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Store one atomic memory fragment (1-3 sentences, one fact/decision/error/preference/"
        "procedure/relation/episode). Content over 4000 characters is refused; non-episode content "
        "is cut at 300 characters. Secrets (passwords, tokens, API or private keys) are never stored. "
        "Content this key already holds in the same workspace and scope is not stored again: the reply "
        "carries the stored fragment's id with duplicate=true.",
        RememberArgs, "ingest", ("store", "dedup", "supersede", "link", "dryRun", "idempotency"), "write", False,
    ),
    ToolSpec(
        "batch_remember",
        "Store up to 200 fragments in one transaction; results[i] answers fragments[i]. "
        "async=true queues them and returns a jobId for batch_status. An item whose content is already "
        "stored (or repeats an earlier item) answers the stored id with duplicate=true.",
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
        ForgetArgs, "ingest", ("delete", "dryRun"), "write", False, destructive=True,
    ),
    ToolSpec(
        "amend",
        "Update a fragment's content or metadata in place, keeping its id and links; every change "
        "keeps the previous state as a version. supersedes=true replaces it with a new fragment.",
        AmendArgs, "ingest", ("update", "version", "supersede", "dryRun"), "write", False, destructive=True,
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
