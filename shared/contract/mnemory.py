"""Request models of the mnemory REST surface (reference 004), names, defaults and limits as
the reference writes them. The gateway takes them as HTTP bodies; recall and ingest take the
same fields (plus the caller's agent, which only the gateway sets) as internal arguments."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from shared.contract.base import Id, ToolArgs
from shared.domain.fragment import MAX_CONTENT_CHARS, MAX_ID_CHARS

# reference 004: a search query or question of at most 10,000 characters; a message 100,000.
MAX_QUERY_CHARS = 10_000
MAX_MESSAGE_CHARS = 100_000
MAX_BY_IDS = 500
MAX_BATCH = 100


class _Args(ToolArgs):
    # Set by the gateway from X-Agent-Id (or the JWT's agent_id claim), never by the body.
    caller_agent_id: Id | None = None


class AddMemoryRequest(_Args):
    """Add a single memory."""

    content: str = Field(
        max_length=MAX_CONTENT_CHARS,
        description="Memory content (at most 4000 characters; types other than episodic are stored cut at 300).",
    )
    memory_type: str | None = Field(None, description="Memory type: preference, fact, episodic, procedural, context")
    categories: list[str] | None = Field(None, max_length=20, description="Category tags from predefined set")
    importance: str | None = Field(None, description="Importance: low, normal, high, critical")
    pinned: bool | None = Field(None, description="Pin to core memories (loaded at conversation start)")
    infer: bool = Field(True, description="Extract facts with the LLM when configured; else stored as given (README)")
    role: Literal["user", "assistant"] = Field("user", description="Who this memory is about: 'user' or 'assistant'")
    ttl_days: int | None = Field(None, ge=1, le=36_500, description="Time-to-live in days (None = no expiry)")
    event_date: str | None = Field(None, max_length=64, description="ISO 8601 datetime for when the event occurred")
    labels: dict[str, Any] | None = Field(None, description="Key-value labels for client-specific metadata")


class BatchMemoryItem(AddMemoryRequest):
    pass


class AddMemoriesBatchRequest(_Args):
    memories: list[BatchMemoryItem] = Field(min_length=1, max_length=MAX_BATCH, description="List of memories to add")


class _Filters(_Args):
    memory_type: str | None = Field(None, description="Filter by memory type")
    categories: list[str] | None = Field(None, max_length=20, description="Filter by categories")
    role: str | None = Field(None, description="Filter by role: 'user' or 'assistant'")
    limit: int = Field(10, ge=1, le=100, description="Max results to return")
    include_decayed: bool = Field(False, description="Include expired/decayed memories")
    labels: dict[str, Any] | None = Field(None, description="Filter by label key-value pairs (AND logic)")


class SearchMemoriesRequest(_Filters):
    query: str = Field(max_length=MAX_QUERY_CHARS, description="Search query (natural language)")
    date_start: str | None = Field(None, max_length=32, description="Filter by date range start (YYYY-MM-DD)")
    date_end: str | None = Field(None, max_length=32, description="Filter by date range end (YYYY-MM-DD)")
    # Not in the reference's body: /api/recall's score_threshold, applied on top of the server's.
    score_threshold: float | None = Field(None, ge=0, le=1, exclude=True)


class FindMemoriesRequest(_Filters):
    question: str = Field(max_length=MAX_QUERY_CHARS, description="Natural language question")
    context: str | None = Field(None, max_length=MAX_QUERY_CHARS, description="Optional context hint for query generation")


class ListMemoriesArgs(_Args):
    memory_type: str | None = None
    categories: list[str] | None = None
    role: str | None = None
    limit: int = Field(50, ge=1, le=5000)
    include_decayed: bool = False
    sort: Literal["newest", "oldest"] | None = None
    labels: dict[str, Any] | None = None
    memory_layer: Literal["raw", "consolidated"] | None = None


class GetMemoriesByIdsRequest(_Args):
    ids: list[Id] = Field(min_length=1, max_length=MAX_BY_IDS, description="Memory IDs to fetch (max 500)")


class CoreArgs(_Args):
    recent_days: int = Field(7, ge=0, le=3650)
    include_stats: bool = False
    include_raw: bool = False


class RecentArgs(_Args):
    days: int = Field(7, ge=0, le=3650)
    scope: Literal["all", "user", "agent"] = "all"
    limit: int = Field(25, ge=1, le=100)
    include_decayed: bool = False


class UpdateMemoryRequest(_Args):
    """Update an existing memory."""

    content: str | None = Field(None, max_length=1_000, description="New content text")
    memory_type: str | None = Field(None, description="New memory type")
    categories: list[str] | None = Field(None, max_length=20, description="New categories (replaces existing)")
    importance: str | None = Field(None, description="New importance level")
    pinned: bool | None = Field(None, description="New pinned state")
    ttl_days: int | None = Field(None, ge=1, le=36_500, description="New TTL in days")
    event_date: str | None = Field(None, max_length=64, description="New event date (ISO 8601, e.g., '2023-05-08')")
    labels: dict[str, Any] | None = Field(None, description="Updated labels (empty dict clears, omit to keep existing)")
    agent_id: str | None = Field(
        None, max_length=MAX_ID_CHARS,
        description="New agent_id. Non-empty string to set, empty string to clear. Null (omitted) means no change.",
    )


class MemoryIdArgs(_Args):
    memory_id: Id


class MessageParam(ToolArgs):
    """A single message in OpenAI chat format; other fields are ignored."""

    role: str = Field(description="Message role: user, assistant, system, tool")
    content: str | None = Field(None, max_length=MAX_MESSAGE_CHARS, description="Message text content")

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        normalized = value.strip().lower()
        if normalized not in ("user", "assistant", "system", "tool"):
            raise ValueError(f"Invalid message role '{value}'. Valid roles: assistant, system, tool, user")
        return normalized


class RememberRequest(_Args):
    session_id: Id | None = Field(None, description="Session ID to update known memory IDs")
    messages: list[MessageParam] = Field(max_length=200, description="OpenAI-format messages (typically last 2: user + assistant)")
    context: str | None = Field(None, max_length=MAX_QUERY_CHARS, description="Optional context hint (e.g., active project)")
    role: Literal["user", "assistant"] | None = Field(
        None, description="Extraction point of view: null = every participant, 'user', or 'assistant' (needs X-Agent-Id)"
    )
    labels: dict[str, Any] | None = Field(None, description="Labels to attach to all extracted memories")


class SessionListArgs(_Args):
    offset: int = Field(0, ge=0)
    limit: int = Field(50, ge=1, le=200)
    consolidation_state: str | None = Field(None, max_length=32)
    q: str | None = Field(None, max_length=1000)
    sort_by: Literal["updated_at", "created_at"] = "updated_at"
    sort_dir: Literal["asc", "desc"] = "desc"


class SessionArgs(_Args):
    session_id: Id
    delete_memories: bool = False
