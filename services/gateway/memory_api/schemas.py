"""Request and reply shapes of the memory REST API (reference 001), exactly as it spells them.

Requests are strict, as the reference's serde types are: a missing required field or a
value of the wrong type is a 422 (a body that is not JSON at all is a 400: wire.py), enums
are lowercase and a misspelt one is refused, never corrected. Unknown body fields are
ignored (serde's default); the two query types the reference marks deny_unknown_fields
(the entry list's filters, import's onConflict) refuse unknown keys with a 400."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MemorySource = Literal["auto", "manual"]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class CreateNamespaceRequest(_Request):
    name: str
    # Required, as a plain String: an empty string means "no description".
    description: str


class UpdateNamespaceRequest(_Request):
    name: str | None = None
    description: str | None = None
    enabled: bool | None = None


class ToggleNamespaceRequest(_Request):
    enabled: bool


class CreateEntryRequest(_Request):
    content: str
    source: MemorySource  # required: no default, nothing inferred
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None


class UpdateEntryRequest(_Request):
    content: str | None = None
    source: MemorySource | None = None
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None


class BulkDeleteRequest(_Request):
    ids: list[str]


class MoveEntriesRequest(_Request):
    ids: list[str]
    # A UUID in its string form (strict mode would take only a UUID object).
    targetNamespaceId: uuid.UUID = Field(strict=False)


class ConsolidationConfig(_Request):
    similarityThreshold: float | None = None
    maxEntryAgeDays: int | None = Field(None, ge=0, le=1_000_000)  # a date arithmetic past this overflows


class ConsolidateRequest(_Request):
    config: ConsolidationConfig | None = None


class ChatMessage(_Request):
    role: str
    content: str


class ExtractRequest(_Request):
    messages: list[ChatMessage]
    model: str | None = None
    config: dict[str, Any] | None = None


class EnsureModelRequest(_Request):
    model: str | None = None


class ImportRequest(_Request):
    """The document travels as a JSON string under `data`, not as a nested object."""

    data: str


# Replies (documentation only: the services build them).


class MemoryNamespace(BaseModel):
    id: uuid.UUID
    name: str
    description: str
    enabled: bool
    createdAt: str
    updatedAt: str


class MemoryEntry(BaseModel):
    id: str
    namespaceId: uuid.UUID
    content: str
    source: MemorySource
    tags: list[str]
    metadata: dict[str, Any]
    createdAt: str
    updatedAt: str


class MemoryEntryPage(BaseModel):
    entries: list[MemoryEntry]
    total: int


class MemoryContext(BaseModel):
    content: str
    tokenCount: int
    entryCount: int
    namespaceCount: int


class MemoryBulkDeleteResult(BaseModel):
    deleted: int
    missing: list[str]


class MemoryMoveResult(BaseModel):
    moved: int
    missing: list[str]


class MemoryImportSummary(BaseModel):
    created: list[str]
    merged: list[str]
    skipped: list[str]
    refused: list[str]
    entriesImported: int


class NamespaceExport(BaseModel):
    namespace: MemoryNamespace
    entries: list[MemoryEntry]


class StoreExport(BaseModel):
    version: int
    exportedAt: str
    namespaces: list[NamespaceExport]


class ConsolidationResult(BaseModel):
    mergedCount: int
    removedCount: int
    unchangedCount: int
    prunedCount: int


class LlmConsolidationReport(BaseModel):
    namespacesScanned: int
    namespacesSkipped: int
    clustersFound: int
    clustersConsolidated: int
    clustersFailed: int
    entriesRemoved: int
    entriesCreated: int
    llmCalls: int
    llmFailed: int


class ConsolidationStatus(BaseModel):
    enabled: bool
    intervalHours: float
    due: bool
    lastRunAt: str | None
    lastAttemptAt: str | None = None
    lastError: str | None = None


class ExtractionEmptyReason(BaseModel):
    reason: Literal["nothingWorthSaving", "allDeduped", "parseRecoveryFailed", "validationEmpty"]
    candidateCount: int | None = None


class ExtractionResult(BaseModel):
    created: int
    updated: int
    skipped: int
    emptyReason: ExtractionEmptyReason | None = None


EnsureModelOutcome = Literal["alreadyLoaded", "loaded", "disabled", "modelNotFound", "insufficientRam", "timedOut", "failed"]


class MemoryError(BaseModel):
    error: str
    message: str
