"""The memory REST API of reference 001 under /api/v1/memory: namespaces, entries, search,
stats, the injection context, export / import, bulk verbs, extraction and consolidation.
(The event transports, /memory/events and /memory/ws, are events.py.)

Each route authenticates (wire.py), checks the request's shape, and forwards to recall
(reads) or ingest (writes, the model passes); nothing here touches memory itself."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import Response

from services.gateway.memory_api import schemas, transfer
from services.gateway.memory_api.wire import MemoryRead, MemoryRoute, MemoryWrite, deny_unknown_query, error_response, forward
from shared.domain import memory_banks as banks

router = APIRouter(prefix="/api/v1/memory", tags=["Memory"], route_class=MemoryRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.MemoryError, "description": text}
    for code, text in ((400, "Bad Request"), (401, "Unauthorized"), (403, "Forbidden: the key lacks the scope"),
                       (404, "Not Found"), (422, "Unprocessable Entity"))
}

# -- namespaces ---------------------------------------------------------------------------


@router.get("/namespaces", dependencies=[MemoryRead], response_model=list[schemas.MemoryNamespace], responses=_ERRORS)
async def list_namespaces(request: Request) -> Response:
    return await forward(request, "recall", "memory_list_namespaces", {})


@router.post("/namespaces", dependencies=[MemoryWrite], status_code=201, response_model=schemas.MemoryNamespace, responses=_ERRORS)
async def create_namespace(request: Request, body: schemas.CreateNamespaceRequest) -> Response:
    return await forward(request, "ingest", "memory_create_namespace", body.model_dump(), status=201)


@router.get("/namespaces/{id}", dependencies=[MemoryRead], response_model=schemas.MemoryNamespace, responses=_ERRORS)
async def get_namespace(request: Request, id: uuid.UUID) -> Response:
    return await forward(request, "recall", "memory_get_namespace", {"id": str(id)})


@router.put("/namespaces/{id}", dependencies=[MemoryWrite], response_model=schemas.MemoryNamespace, responses=_ERRORS)
async def update_namespace(request: Request, id: uuid.UUID, body: schemas.UpdateNamespaceRequest) -> Response:
    """Fields left out are left as they are."""
    return await forward(request, "ingest", "memory_update_namespace", {"id": str(id), **body.model_dump()})


@router.delete("/namespaces/{id}", dependencies=[MemoryWrite], status_code=204, responses=_ERRORS)
async def delete_namespace(request: Request, id: uuid.UUID) -> Response:
    """The namespace and every entry in it."""
    return await forward(request, "ingest", "memory_delete_namespace", {"id": str(id)}, status=204)


@router.patch("/namespaces/{id}/toggle", dependencies=[MemoryWrite], response_model=schemas.MemoryNamespace, responses=_ERRORS)
async def toggle_namespace(request: Request, id: uuid.UUID, body: schemas.ToggleNamespaceRequest) -> Response:
    """Sets `enabled` to the value sent (idempotent); it never flips. `{}` is a 422, a
    0-byte body a 400."""
    return await forward(request, "ingest", "memory_toggle_namespace", {"id": str(id), "enabled": body.enabled})


# -- entries ------------------------------------------------------------------------------

_LIST_KEYS = ("tag", "q", "sort", "order", "limit", "offset")


@router.get(
    "/namespaces/{ns_id}/entries", dependencies=[MemoryRead, Depends(deny_unknown_query(*_LIST_KEYS))],
    response_model=list[schemas.MemoryEntry] | schemas.MemoryEntryPage, responses=_ERRORS,
)
async def list_entries(
    request: Request, ns_id: uuid.UUID,
    tag: str | None = Query(None, description="exact match with one of the entry's tags"),
    q: str | None = Query(None, description="case-insensitive substring of the content"),
    sort: Literal["created", "updated"] | None = Query(None),
    order: Literal["asc", "desc"] | None = Query(None),
    limit: int | None = Query(None, ge=1, le=banks.PAGE_LIMIT_MAX, description="default 100; 0 and > 1000 are refused"),
    offset: int | None = Query(None, ge=0, le=2**31 - 1),  # inside Postgres' bigint OFFSET
) -> Response:
    """No query parameter: a bare array in storage order. Any parameter: `{entries, total}`,
    total counted before limit and offset."""
    query = None
    if request.query_params:
        query = {"tag": tag, "q": q, "sort": sort, "order": order, "limit": limit, "offset": offset}
    return await forward(request, "recall", "memory_list_entries", {"namespaceId": str(ns_id), "query": query})


@router.post(
    "/namespaces/{ns_id}/entries", dependencies=[MemoryWrite], status_code=201, response_model=schemas.MemoryEntry, responses=_ERRORS,
)
async def create_entry(request: Request, ns_id: uuid.UUID, body: schemas.CreateEntryRequest) -> Response:
    return await forward(request, "ingest", "memory_create_entry", {"namespaceId": str(ns_id), **body.model_dump()}, status=201)


@router.delete("/namespaces/{ns_id}/entries", dependencies=[MemoryWrite], status_code=204, responses=_ERRORS)
async def clear_entries(request: Request, ns_id: uuid.UUID) -> Response:
    """Empties the namespace and keeps it."""
    return await forward(request, "ingest", "memory_clear_entries", {"namespaceId": str(ns_id)}, status=204)


@router.post(
    "/namespaces/{ns_id}/entries/bulk-delete", dependencies=[MemoryWrite], response_model=schemas.MemoryBulkDeleteResult,
    responses=_ERRORS,
)
async def bulk_delete(request: Request, ns_id: uuid.UUID, body: schemas.BulkDeleteRequest) -> Response:
    """1 to 1000 ids (else 400); ids not in the namespace come back as `missing`."""
    return await forward(request, "ingest", "memory_bulk_delete", {"namespaceId": str(ns_id), "ids": body.ids})


@router.post(
    "/namespaces/{ns_id}/entries/move", dependencies=[MemoryWrite], response_model=schemas.MemoryMoveResult, responses=_ERRORS,
)
async def move_entries(request: Request, ns_id: uuid.UUID, body: schemas.MoveEntriesRequest) -> Response:
    """Keeps each entry's id, content, source, tags, metadata and timestamps."""
    arguments = {"namespaceId": str(ns_id), "ids": body.ids, "targetNamespaceId": str(body.targetNamespaceId)}
    return await forward(request, "ingest", "memory_move_entries", arguments)


@router.get("/namespaces/{ns_id}/entries/{id}", dependencies=[MemoryRead], response_model=schemas.MemoryEntry, responses=_ERRORS)
async def get_entry(request: Request, ns_id: uuid.UUID, id: str) -> Response:
    return await forward(request, "recall", "memory_get_entry", {"namespaceId": str(ns_id), "id": id})


@router.put("/namespaces/{ns_id}/entries/{id}", dependencies=[MemoryWrite], response_model=schemas.MemoryEntry, responses=_ERRORS)
async def update_entry(request: Request, ns_id: uuid.UUID, id: str, body: schemas.UpdateEntryRequest) -> Response:
    """Fields left out are left as they are; new content is re-embedded."""
    return await forward(request, "ingest", "memory_update_entry", {"namespaceId": str(ns_id), "id": id, **body.model_dump()})


@router.delete("/namespaces/{ns_id}/entries/{id}", dependencies=[MemoryWrite], status_code=204, responses=_ERRORS)
async def delete_entry(request: Request, ns_id: uuid.UUID, id: str) -> Response:
    return await forward(request, "ingest", "memory_delete_entry", {"namespaceId": str(ns_id), "id": id}, status=204)


# -- search, stats, context ---------------------------------------------------------------


@router.get("/entries", dependencies=[MemoryRead], response_model=list[schemas.MemoryEntry], responses=_ERRORS)
async def search_entries(
    request: Request,
    q: str = Query(..., description="the query (not `query`); 1 to 500 bytes"),
    namespace: Annotated[uuid.UUID | None, Query(description="only this namespace")] = None,
    limit: int | None = Query(None, ge=1, le=banks.PAGE_LIMIT_MAX, description="top-K after ranking (default 20)"),
) -> Response:
    """Relevance search, best first (recall's ranking)."""
    arguments = {"q": q, "namespace": str(namespace) if namespace else None, "limit": limit}
    return await forward(request, "recall", "memory_search", arguments)


@router.get("/entries/enabled", dependencies=[MemoryRead], response_model=list[schemas.MemoryEntry], responses=_ERRORS)
async def enabled_entries(request: Request) -> Response:
    """Every entry of every enabled namespace, unranked; takes no parameters (any are ignored)."""
    return await forward(request, "recall", "memory_enabled_entries", {})


@router.get("/stats", dependencies=[MemoryRead], responses=_ERRORS)
async def stats(request: Request) -> Response:
    return await forward(request, "recall", "memory_api_stats", {})


@router.get("/context", dependencies=[MemoryRead], response_model=schemas.MemoryContext, responses=_ERRORS)
async def context(
    request: Request,
    max_tokens_camel: int | None = Query(None, alias="maxTokens", ge=0, description="default 2000; 0 is refused; capped at 100000"),
    max_tokens: int | None = Query(None, ge=0, description="alias of maxTokens"),
    record_camel: bool | None = Query(None, alias="recordReference", description="default true; false for display only"),
    record_reference: bool | None = Query(None, description="alias of recordReference"),
) -> Response:
    tokens = max_tokens_camel if max_tokens_camel is not None else max_tokens
    if tokens == 0:
        return error_response(400, "maxTokens must be at least 1")
    record = record_camel if record_camel is not None else record_reference
    arguments = {"maxTokens": tokens or banks.CONTEXT_TOKENS_DEFAULT, "recordReference": True if record is None else record}
    return await forward(request, "recall", "memory_context", arguments)


# -- export, import -----------------------------------------------------------------------


@router.post("/namespaces/{ns_id}/export", dependencies=[MemoryRead], response_model=schemas.NamespaceExport, responses=_ERRORS)
async def export_namespace(request: Request, ns_id: uuid.UUID) -> Response:
    """memory_read on purpose: it renders the namespace and stores nothing."""
    return await forward(request, "recall", "memory_export_namespace", {"id": str(ns_id)})


@router.get("/export", dependencies=[MemoryRead], response_model=schemas.StoreExport, responses=_ERRORS)
async def export_store(request: Request) -> Response:
    """Everything, agent-experience banks included, entries as stored: treat the reply like a
    credential dump (write it 0600, never to a shared or world-readable place)."""
    return await transfer.export_store(request)


@router.post(
    "/import", dependencies=[MemoryWrite, Depends(deny_unknown_query("onConflict"))],
    response_model=schemas.MemoryImportSummary | schemas.MemoryNamespace,
    responses={**_ERRORS, 413: {"model": schemas.MemoryError, "description": "the body is over 50 MiB"}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": schemas.ImportRequest.model_json_schema()}}}},
)
async def import_document(request: Request, on_conflict: Literal["merge", "skip"] = Query("merge", alias="onConflict")) -> Response:
    """`{"data": "<export document as a string>"}`, up to 50 MiB. The whole-store shape
    answers MemoryImportSummary, the single-namespace shape the namespace it created."""
    return await transfer.import_document(request, on_conflict)


# -- extraction and consolidation ---------------------------------------------------------


@router.post("/extract", dependencies=[MemoryWrite], response_model=schemas.ExtractionResult,
             responses={**_ERRORS, 503: {"model": schemas.MemoryError, "description": "no LLM configured"}})
async def extract(request: Request, body: schemas.ExtractRequest) -> Response:
    """The transcript is checked first (400 even without a model), then 503 without one."""
    return await forward(request, "ingest", "memory_extract", body.model_dump())


@router.post("/ensure-model-available", dependencies=[MemoryWrite], response_model=schemas.EnsureModelOutcome, responses=_ERRORS)
async def ensure_model_available(request: Request, body: Annotated[schemas.EnsureModelRequest | None, Body()] = None) -> Response:
    return await forward(request, "ingest", "memory_ensure_model", {"model": body.model if body else None})


@router.post("/namespaces/{ns_id}/consolidate", dependencies=[MemoryWrite], response_model=schemas.ConsolidationResult,
             responses=_ERRORS)
async def consolidate_namespace(
    request: Request, ns_id: uuid.UUID, body: Annotated[schemas.ConsolidateRequest | None, Body()] = None
) -> Response:
    """Lexical, no model: near-duplicate auto entries merged, stale ones pruned, among the 500
    most recently updated auto entries. Manual entries are never touched."""
    config = body.config.model_dump() if body and body.config else None
    return await forward(request, "ingest", "memory_consolidate_namespace", {"namespaceId": str(ns_id), "config": config})


@router.post("/consolidation/run", dependencies=[MemoryWrite], response_model=schemas.LlmConsolidationReport,
             responses={**_ERRORS, 503: {"model": schemas.MemoryError, "description": "no LLM configured"}})
async def run_consolidation(request: Request) -> Response:
    return await forward(request, "ingest", "memory_run_consolidation", {})


@router.get("/consolidation/status", dependencies=[MemoryRead], response_model=schemas.ConsolidationStatus, responses=_ERRORS)
async def consolidation_status(request: Request) -> Response:
    return await forward(request, "ingest", "memory_consolidation_status", {})
