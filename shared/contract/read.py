"""Tool arguments of the read path, as the reference names them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from shared.contract.base import Id, Int64, Keyword, Label, ToolArgs
from shared.contract.spec import ToolSpec
from shared.domain.fragment import MAX_CONTENT_CHARS, MAX_LIST_ITEMS

RESPONSE_FIELDS = (
    "id", "content", "type", "topic", "keywords", "importance", "created_at", "access_count", "confidence",
    "linked", "explanations", "workspace", "context_summary", "case_id", "valid_to", "affect", "ema_activation",
)


_TYPES = "fact, decision, error, preference, procedure, relation, episode"
_AFFECTS = "neutral, frustration, confidence, surprise, doubt, satisfaction"
_AGENT = "Agent id: isolates one agent's fragments within the key (default: the key's own agent)."
_WORKSPACE = "Limit to this workspace plus global (workspace-less) fragments; default: the key's default workspace."


class TimeRange(ToolArgs):
    from_: Label | None = Field(None, alias="from", description="Start of the range: ISO 8601 or natural language (e.g. 'last week').")
    to: Label | None = Field(None, description="End of the range: ISO 8601 or natural language; default now.")


class RecallArgs(ToolArgs):
    keywords: list[Keyword] | None = Field(
        None, max_length=50,
        description="Exact keywords to match (L1/L2 keyword and full-text layers), e.g. ['nginx', '502']. "
        "Without text, the keywords also drive a semantic search of content.",
    )
    text: str | None = Field(
        None, max_length=MAX_CONTENT_CHARS,
        description="The natural-language query (semantic L3 search), e.g. 'why did the deploy fail?'. "
        "This is the query parameter ('query' is accepted as an alias). Give text, keywords, topic, caseId or contextText.",
    )
    topic: Label | None = Field(None, description="Only fragments of this topic (e.g. database, deployment).")
    type: Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"] | None = Field(
        None, description=f"Only fragments of this type: {_TYPES}.")
    tokenBudget: int = Field(1000, ge=1, le=100_000, description="Most tokens the returned fragments may use (default 1000).")
    includeLinks: bool = Field(True, description="Add 1-hop linked fragments (resolved_by/caused_by first) to each result (default true).")
    linkRelationType: Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"] | None = Field(
        None, description="Only follow links of this relation: related, caused_by, resolved_by, part_of, contradicts.")
    threshold: float | None = Field(
        None, ge=0, le=1, description="Minimum similarity (0-1) a result must reach; overrides the default relevance floor.")
    includeSuperseded: bool = Field(False, description="Also return superseded (expired) fragments (default false).")
    includePeerAgents: bool = Field(
        False, description="Also return other agents' fragments of the same key and workspace (default false).")
    includeKeyName: bool = Field(False, description="Add key_id and key_name (the access key's label) to each fragment (default false).")
    asOf: Label | None = Field(None, description="ISO 8601 time: only fragments that were valid at that moment.")
    excludeSeen: bool = Field(True, description="Skip fragments context() already injected into this session (default true).")
    includeKeywords: bool = Field(False, description="Add each fragment's keywords array to the reply (default false).")
    includeContext: bool = Field(
        False, description="Add context_summary and nearby fragments (nearby_context), and stitched_context for the top 3.")
    timeRange: TimeRange | None = Field(
        None, description="{from, to}: only fragments created in this range (ISO 8601 or natural language).")
    caseId: Id | None = Field(None, description="Only fragments of this case (task) id.")
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = Field(
        None, description="Only fragments with this resolution status: open, resolved, abandoned.")
    phase: Label | None = Field(None, description="Only fragments of this work phase (e.g. planning, debugging, verification).")
    caseMode: bool = Field(
        False, description="Case-based reasoning: group results by case id into (goal, events, outcome) triples (default false).")
    maxCases: int = Field(5, ge=1, le=10, description="Most cases caseMode returns (default 5, at most 10).")
    depth: Literal["high-level", "detail", "tool-level"] | None = Field(
        None, description="Type filter by level: high-level = decision, episode (planning); detail = all types (default); "
        "tool-level = procedure, error, fact (execution steps, settings).")
    workspace: Label | None = Field(None, description=_WORKSPACE)
    contextText: str | None = Field(
        None, max_length=MAX_CONTENT_CHARS,
        description="The current conversation's text: pre-activates related fragments (spreading activation).")
    cursor: str | None = Field(None, description="Pagination cursor: the nextCursor of the previous page.")
    pageSize: int = Field(20, ge=1, le=50, description="Fragments per page (default 20, at most 50).")
    agentId: Id | None = Field(None, description=_AGENT)
    minImportance: float | None = Field(None, ge=0, le=1, description="Only fragments with at least this importance (0-1).")
    isAnchor: bool | None = Field(None, description="true: only anchored (pinned core) fragments.")
    affect: (
        Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]
        | list[Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]]
        | None
    ) = Field(None, description=f"Only fragments tagged with this affect (one value or a list): {_AFFECTS}.")
    fields: list[Literal[RESPONSE_FIELDS]] | None = Field(  # type: ignore[valid-type]
        None, description=f"Return only these fragment fields to save tokens (default all): {', '.join(RESPONSE_FIELDS)}.")

    @model_validator(mode="before")
    @classmethod
    def _query_is_text(cls, data: Any) -> Any:
        # A model's first call often says `query`; the reference ignores unknown arguments,
        # so taking it as `text` (when text is absent) changes no call the reference accepts.
        if isinstance(data, dict) and data.get("text") is None and isinstance(data.get("query"), str):
            return {**data, "text": data["query"]}
        return data


class MemoryStatsArgs(ToolArgs):
    pass


FragmentType = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]


class ContextArgs(ToolArgs):
    tokenBudget: int = Field(2000, ge=1, le=100_000, description="Most tokens the loaded memory may use (default 2000).")
    types: list[FragmentType] | None = Field(
        None, max_length=MAX_LIST_ITEMS, description=f"Fragment types to load (default preference, error, procedure); any of {_TYPES}.")
    sessionId: Id | None = Field(None, description="Session id whose working memory (session-scope fragments) to load.")
    agentId: Id | None = Field(None, description=_AGENT)
    workspace: Label | None = Field(None, description=_WORKSPACE)
    structured: bool = Field(False, description="true: a hierarchical tree; false: a flat list (default false).")
    includeKeyName: bool = Field(False, description="Add key_id and key_name to each fragment of the flat list (default false).")


_TRACE_TYPE = f"Only fragments of this type: {_TYPES}."


class SearchTracesArgs(ToolArgs):
    """Each filter in both spellings (seed): snake_case and its camelCase alias."""

    event_type: FragmentType | None = Field(None, description=_TRACE_TYPE)
    eventType: FragmentType | None = Field(None, description="camelCase alias of event_type.")
    entity_key: Label | None = Field(None, description="Topic filter (case-insensitive substring, ILIKE).")
    entityKey: Label | None = Field(None, description="camelCase alias of entity_key.")
    keyword: Label | None = Field(None, description="A word or phrase the content must contain.")
    case_id: Id | None = Field(None, description="Only fragments of this case id.")
    caseId: Id | None = Field(None, description="camelCase alias of case_id.")
    session_id: Id | None = Field(None, description="Only fragments stored in this session.")
    sessionId: Id | None = Field(None, description="camelCase alias of session_id.")
    time_range: TimeRange | None = Field(None, description="{from, to}: only fragments created in this range (ISO 8601).")
    limit: int = Field(20, ge=1, le=100, description="Most fragments returned, newest first (default 20, at most 100).")
    workspace: Label | None = Field(None, description="Limit to this workspace plus global (workspace-less) fragments.")


class ReconstructHistoryArgs(ToolArgs):
    caseId: Id | None = Field(None, description="The case whose history to rebuild (give caseId or entity).")
    entity: Label | None = Field(None, description="Topic (entity key) whose history to rebuild, when there is no caseId.")
    timeRange: TimeRange | None = Field(None, description="{from, to}: only events in this range (ISO 8601).")
    query: str | None = Field(None, max_length=MAX_CONTENT_CHARS, description="Extra keyword filter on the content.")
    limit: int = Field(100, ge=1, le=500, description="Most fragments in the timeline (default 100, at most 500).")
    workspace: Label | None = Field(None, description="Limit to this workspace plus global (workspace-less) fragments.")


class GraphExploreArgs(ToolArgs):
    startId: Id = Field(description="Fragment id to start from (an error fragment is best).")
    agentId: Id | None = Field(None, description=_AGENT)


class FragmentHistoryArgs(ToolArgs):
    id: Id = Field(description="Id of the fragment whose versions to list.")
    agentId: Id | None = Field(None, description=_AGENT)
    includePeerAgents: bool = Field(False, description="Also follow other agents' versions within the same key (default false).")


class ToolFeedbackArgs(ToolArgs):
    tool_name: str = Field(min_length=1, max_length=100, description="Name of the tool being rated, e.g. recall.")
    relevant: bool = Field(description="Was the result relevant to what was asked?")
    sufficient: bool = Field(description="Was the result enough to finish the task?")
    # seed: suggestion "100자 이내", context "50자 이내" — longer text is cut, not refused.
    suggestion: str | None = Field(None, description="How the result could be better (at most 100 characters; longer is cut).")
    context: str | None = Field(None, description="What the tool was used for (at most 50 characters; longer is cut).")
    session_id: Id | None = Field(None, description="Session id the rated call belonged to.")
    trigger_type: Literal["sampled", "voluntary"] = Field(
        "voluntary", description="sampled: answering a feedback_sampled hint; voluntary: on your own (default).")
    # Values outside the enum are discarded to NULL (seed), so this is a plain string here.
    irrelevance_reason: Label | None = Field(
        None, description="With relevant=false, why: not_stored, search_miss, scope_leak, topic_mismatch or other.")
    search_event_id: Int64 | None = Field(None, ge=1, description="The _meta.searchEventId of the recall being rated.")
    fragment_ids: list[Id] | None = Field(
        None, max_length=MAX_LIST_ITEMS, description="Ids of the fragments rated; their activation is adjusted by the feedback.")


READ_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "recall",
        "Search memory: keyword and full-text (L2) fused with semantic vector search (L3), "
        "best first, packed into tokenBudget. Put the natural-language query in `text` (or exact terms "
        "in `keywords`). Linked fragments come as id and relation (plus a short preview when they are "
        "not results themselves); any cut content says so (truncated, content_length).",
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
