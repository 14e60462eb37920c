"""Tool arguments of the read path, as the reference names them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.contract.base import Id, Int64, Keyword, Label, ToolArgs
from shared.contract.spec import ToolSpec
from shared.domain.fragment import MAX_CONTENT_CHARS, MAX_LIST_ITEMS

RESPONSE_FIELDS = (
    "id", "content", "type", "topic", "keywords", "importance", "created_at", "access_count", "confidence",
    "linked", "explanations", "workspace", "context_summary", "case_id", "valid_to", "affect", "ema_activation",
)


class TimeRange(ToolArgs):
    from_: Label | None = Field(None, alias="from")
    to: Label | None = None


class RecallArgs(ToolArgs):
    keywords: list[Keyword] | None = Field(None, max_length=50)
    text: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    topic: Label | None = None
    type: Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"] | None = None
    tokenBudget: int = Field(1000, ge=1, le=100_000)
    includeLinks: bool = True
    linkRelationType: Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"] | None = None
    threshold: float | None = Field(None, ge=0, le=1)
    includeSuperseded: bool = False
    includePeerAgents: bool = False
    includeKeyName: bool = False
    asOf: Label | None = None
    excludeSeen: bool = True
    includeKeywords: bool = False
    includeContext: bool = False
    timeRange: TimeRange | None = None
    caseId: Id | None = None
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = None
    phase: Label | None = None
    caseMode: bool = False
    maxCases: int = Field(5, ge=1, le=10)
    depth: Literal["high-level", "detail", "tool-level"] | None = None
    workspace: Label | None = None
    contextText: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    cursor: str | None = None
    pageSize: int = Field(20, ge=1, le=50)
    agentId: Id | None = None
    minImportance: float | None = Field(None, ge=0, le=1)
    isAnchor: bool | None = None
    affect: (
        Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]
        | list[Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]]
        | None
    ) = None
    fields: list[Literal[RESPONSE_FIELDS]] | None = None  # type: ignore[valid-type]


class MemoryStatsArgs(ToolArgs):
    pass


FragmentType = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]


class ContextArgs(ToolArgs):
    tokenBudget: int = Field(2000, ge=1, le=100_000)
    types: list[FragmentType] | None = Field(None, max_length=MAX_LIST_ITEMS)
    sessionId: Id | None = None
    agentId: Id | None = None
    workspace: Label | None = None
    structured: bool = False
    includeKeyName: bool = False


class SearchTracesArgs(ToolArgs):
    """Each filter in both spellings (seed): snake_case and its camelCase alias."""

    event_type: FragmentType | None = None
    eventType: FragmentType | None = None
    entity_key: Label | None = None
    entityKey: Label | None = None
    keyword: Label | None = None
    case_id: Id | None = None
    caseId: Id | None = None
    session_id: Id | None = None
    sessionId: Id | None = None
    time_range: TimeRange | None = None
    limit: int = Field(20, ge=1, le=100)
    workspace: Label | None = None


class ReconstructHistoryArgs(ToolArgs):
    caseId: Id | None = None
    entity: Label | None = None
    timeRange: TimeRange | None = None
    query: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    limit: int = Field(100, ge=1, le=500)
    workspace: Label | None = None


class GraphExploreArgs(ToolArgs):
    startId: Id
    agentId: Id | None = None


class FragmentHistoryArgs(ToolArgs):
    id: Id
    agentId: Id | None = None
    includePeerAgents: bool = False


class ToolFeedbackArgs(ToolArgs):
    tool_name: str = Field(min_length=1, max_length=100)
    relevant: bool
    sufficient: bool
    # seed: suggestion "100자 이내", context "50자 이내" — longer text is cut, not refused.
    suggestion: str | None = None
    context: str | None = None
    session_id: Id | None = None
    trigger_type: Literal["sampled", "voluntary"] = "voluntary"
    # Values outside the enum are discarded to NULL (seed), so this is a plain string here.
    irrelevance_reason: Label | None = None
    search_event_id: Int64 | None = Field(None, ge=1)
    fragment_ids: list[Id] | None = Field(None, max_length=MAX_LIST_ITEMS)


READ_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "recall",
        "Search memory: keyword and full-text (L2) fused with semantic vector search (L3), "
        "best first, packed into tokenBudget.",
        RecallArgs, "recall", ("search", "pagination", "caseMode"), "read", True,
    ),
    ToolSpec(
        "context",
        "Load core memory (preference, error, procedure by default), the session's working memory "
        "and its reflections within tokenBudget (default 2000); structured=true returns a tree.",
        ContextArgs, "recall", ("context", "workingMemory", "structured"), "read", True,
    ),
    ToolSpec(
        "search_traces",
        "Exact-match search over fragments (type, topic ILIKE, content keyword, case, session, "
        "time range), newest first, like grep over the history.",
        SearchTracesArgs, "recall", ("search", "traces"), "read", True,
    ),
    ToolSpec(
        "reconstruct_history",
        "Rebuild a case's (or an entity's) history in time order with causal chains and "
        "unresolved branches.",
        ReconstructHistoryArgs, "recall", ("history", "caseMode", "causal"), "read", True,
    ),
    ToolSpec(
        "graph_explore",
        "Root-cause analysis from an error fragment: its caused_by and resolved_by links, one hop.",
        GraphExploreArgs, "recall", ("graph", "rca"), "read", True,
    ),
    ToolSpec(
        "fragment_history",
        "A fragment's amended versions and its superseded_by chain.",
        FragmentHistoryArgs, "recall", ("history", "versions"), "read", True,
    ),
    ToolSpec(
        "memory_stats",
        "Statistics of the caller's memory: counts, TTL distribution, types, retrieval "
        "evaluation and workspace fill.",
        MemoryStatsArgs, "recall", ("stats", "evaluation"), "read", True,
    ),
    ToolSpec(
        "tool_feedback",
        "Rate a tool's result (relevant, sufficient); fragment_ids adjusts those fragments' activation.",
        ToolFeedbackArgs, "recall", ("feedback",), "read", False,
    ),
)
