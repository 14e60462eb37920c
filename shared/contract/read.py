"""Tool arguments of the read path, as the reference names them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.contract.spec import ToolSpec

RESPONSE_FIELDS = (
    "id", "content", "type", "topic", "keywords", "importance", "created_at", "access_count", "confidence",
    "linked", "explanations", "workspace", "context_summary", "case_id", "valid_to", "affect", "ema_activation",
)


class TimeRange(BaseModel):
    model_config = ConfigDict(extra="ignore")
    from_: str | None = Field(None, alias="from")
    to: str | None = None


class RecallArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    keywords: list[str] | None = Field(None, max_length=50)
    text: str | None = Field(None, max_length=4000)
    topic: str | None = None
    type: Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"] | None = None
    tokenBudget: int = Field(1000, ge=1, le=100_000)
    includeLinks: bool = True
    linkRelationType: Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"] | None = None
    threshold: float | None = Field(None, ge=0, le=1)
    includeSuperseded: bool = False
    includePeerAgents: bool = False
    includeKeyName: bool = False
    asOf: str | None = None
    excludeSeen: bool = True
    includeKeywords: bool = False
    includeContext: bool = False
    timeRange: TimeRange | None = None
    caseId: str | None = None
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = None
    phase: str | None = None
    caseMode: bool = False
    maxCases: int = Field(5, ge=1, le=10)
    depth: Literal["high-level", "detail", "tool-level"] | None = None
    workspace: str | None = None
    contextText: str | None = Field(None, max_length=4000)
    cursor: str | None = None
    pageSize: int = Field(20, ge=1, le=50)
    agentId: str | None = None
    minImportance: float | None = Field(None, ge=0, le=1)
    isAnchor: bool | None = None
    affect: (
        Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]
        | list[Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]]
        | None
    ) = None
    fields: list[Literal[RESPONSE_FIELDS]] | None = None  # type: ignore[valid-type]


class MemoryStatsArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")


READ_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "recall",
        "Search memory: keyword and full-text (L2) fused with semantic vector search (L3), "
        "best first, packed into tokenBudget.",
        RecallArgs, "recall", ("search", "pagination", "caseMode"), "read", True,
    ),
    ToolSpec(
        "memory_stats",
        "Statistics of the caller's memory: counts, TTL distribution, types.",
        MemoryStatsArgs, "recall", ("stats",), "read", True,
    ),
)
