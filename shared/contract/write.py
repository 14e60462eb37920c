"""Tool arguments of the write path, as the reference names them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.contract.spec import ToolSpec
from shared.domain.fragment import MAX_CONTENT_CHARS, MAX_IDEMPOTENCY_KEY

FragmentTypeArg = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]


class _Args(BaseModel):
    # Unknown arguments are ignored, as the reference does; known ones are strict.
    model_config = ConfigDict(extra="ignore")


class RememberArgs(_Args):
    """Store one atomic memory fragment."""

    content: str = Field(max_length=MAX_CONTENT_CHARS)
    topic: str = Field(min_length=1, max_length=200)
    type: FragmentTypeArg
    keywords: list[str] | None = Field(None, max_length=50)
    importance: float | None = Field(None, ge=0, le=1)
    source: str | None = None
    linkedTo: list[str] | None = None
    scope: Literal["permanent", "session"] = "permanent"
    isAnchor: bool = False
    supersedes: list[str] | None = None
    contextSummary: str | None = Field(None, max_length=1000)
    sessionId: str | None = None
    workspace: str | None = Field(None, max_length=200)
    agentId: str | None = None
    caseId: str | None = None
    goal: str | None = None
    outcome: str | None = None
    phase: str | None = None
    resolutionStatus: Literal["open", "resolved", "abandoned"] | None = None
    assertionStatus: Literal["observed", "inferred", "verified", "rejected"] = "observed"
    affect: Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"] = "neutral"
    idempotencyKey: str | None = Field(None, max_length=MAX_IDEMPOTENCY_KEY)
    dryRun: bool = False


# seed: at most 200 fragments per batch_remember call.
MAX_BATCH = 200


class BatchRememberArgs(_Args):
    # Items are validated one by one (each failure is reported in results[i]), so they
    # arrive here as plain objects.
    fragments: list[dict] = Field(min_length=1, max_length=MAX_BATCH)
    workspace: str | None = Field(None, max_length=200)
    agentId: str | None = None
    stream: bool | None = None
    async_: bool = Field(False, alias="async")


class ForgetArgs(_Args):
    id: str | None = None
    topic: str | None = None
    force: bool = False
    agentId: str | None = None
    dryRun: bool = False


WRITE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Store one atomic memory fragment (1-3 sentences, one fact/decision/error/preference/"
        "procedure/relation/episode). Content over 4000 characters is refused; non-episode content "
        "is cut at 300 characters.",
        RememberArgs, "ingest", ("store", "dedup", "supersede", "link", "dryRun", "idempotency"), "write", False,
    ),
    ToolSpec(
        "batch_remember",
        "Store up to 200 fragments in one transaction; results[i] answers fragments[i].",
        BatchRememberArgs, "ingest", ("store", "batch", "async"), "write", False,
    ),
    ToolSpec(
        "forget",
        "Delete a fragment by id, or all fragments of a topic. Permanent-tier fragments need force.",
        ForgetArgs, "ingest", ("delete", "dryRun"), "write", False,
    ),
)
