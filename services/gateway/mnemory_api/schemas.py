"""Response models of the mnemory REST surface, as reference 004 shapes them (they also make
/api/openapi.json). Request models are shared.contract.mnemory's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.contract.base import ToolArgs
from shared.contract.mnemory import MessageParam


class MemoryActionResult(BaseModel):
    id: str
    memory: str
    event: str  # ADD, NONE (already stored)


class ArtifactInfo(BaseModel):
    id: str
    filename: str
    size: int
    linked_memories: int


class AddMemoryResponse(BaseModel):
    results: list[MemoryActionResult] = Field(default_factory=list)
    artifact: ArtifactInfo | None = None  # reference 004's auto-artifact; Engram refuses over-long content instead
    error: bool = False
    message: str | None = None


class MemoryItem(BaseModel):
    id: str
    memory: str
    score: float | None = None
    metadata: dict[str, Any] | None = None
    has_artifacts: bool = False


class SearchMemoriesResponse(BaseModel):
    results: list[MemoryItem]


class CoreMemoriesStatsResponse(BaseModel):
    memory_count: int
    char_count: int
    estimated_tokens: int
    by_type: dict[str, int] = Field(default_factory=dict)
    by_role: dict[str, int] = Field(default_factory=dict)
    by_section: dict[str, int] = Field(default_factory=dict)
    section_labels: dict[str, str] = Field(default_factory=dict)
    sections: dict[str, list[str]] = Field(default_factory=dict)
    memory_ids: list[str] = Field(default_factory=list)


class CoreMemoriesResponse(BaseModel):
    text: str
    stats: CoreMemoriesStatsResponse | None = None


class TextResponse(BaseModel):
    text: str


class StatusResponse(BaseModel):
    status: str
    memory_id: str


class CategoryItem(BaseModel):
    name: str
    description: str
    count: int


class ListCategoriesResponse(BaseModel):
    categories: list[CategoryItem]
    total_memories: int


class SessionSummary(BaseModel):
    session_id: str
    summary: str
    created_at: str
    updated_at: str
    consolidation_state: str
    agent_id: str | None = None


class SessionDetail(SessionSummary):
    memory_ids: list[str] = Field(default_factory=list)
    consolidated_memory_ids: list[str] = Field(default_factory=list)
    consolidated_at: str | None = None


class SessionListResponse(BaseModel):
    sessions: list[SessionSummary]
    total: int
    offset: int
    limit: int
    has_more: bool
    total_truncated: bool


class RecallRequest(ToolArgs):
    """reference 004: combined initialize + search."""

    session_id: str | None = Field(None, max_length=200, description="Session ID from previous call. Null = first call.")
    query: str | None = Field(None, max_length=10_000, description="Free text search query")
    messages: list[MessageParam] | None = Field(
        None, max_length=200, description="OpenAI-format messages. Last user message used as query if query not provided.")
    include_instructions: bool = Field(False, description="Include behavioral instructions in response")
    managed: bool = Field(False, description="Use managed-mode instructions (plugin-driven)")
    instruction_mode: str | None = Field(None, max_length=32, description="Override instruction mode (passive/proactive/personality)")
    search_mode: str | None = Field(
        None, max_length=16, description="'find' (multi-query) or 'search' (single vector search); default: find first, then search")
    score_threshold: float | None = Field(None, ge=0, le=1, description="Minimum score for search results (0.0-1.0)")
    recent_days: int = Field(7, ge=0, le=3650, description="Days of recent context for core memories")
    ttl: int | None = Field(None, ge=60, le=30 * 86400, description="Session TTL in seconds (only used on first call)")
    context: str | None = Field(None, max_length=10_000, description="Optional context hint for query generation")
    labels: dict[str, Any] | None = Field(None, description="Filter search results by label key-value pairs")


class RecallStats(BaseModel):
    core_count: int = 0
    search_count: int = 0
    new_count: int = 0
    known_skipped: int = 0
    latency_ms: int = 0


class RecallResponse(BaseModel):
    session_id: str
    instructions: str | None = None
    core_memories: str | None = None
    search_results: list[MemoryItem] = Field(default_factory=list)
    stats: RecallStats = Field(default_factory=RecallStats)


class RememberResponse(BaseModel):
    accepted: bool = True
