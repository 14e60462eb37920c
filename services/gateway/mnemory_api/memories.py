"""/api/memories (reference 004's memory CRUD, artifacts aside) and /api/categories: thin
adapters onto recall's and ingest's mnemory tools."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request

from services.gateway.mnemory_api import upstream
from services.gateway.mnemory_api.auth import MnemoryCaller, reader, writer
from services.gateway.mnemory_api.schemas import (
    AddMemoryResponse,
    CoreMemoriesResponse,
    ListCategoriesResponse,
    SearchMemoriesResponse,
    StatusResponse,
    TextResponse,
)
from shared.contract.mnemory import (
    AddMemoriesBatchRequest,
    AddMemoryRequest,
    FindMemoriesRequest,
    GetMemoriesByIdsRequest,
    SearchMemoriesRequest,
    UpdateMemoryRequest,
)
from shared.domain.fragment import MAX_ID_CHARS

router = APIRouter(prefix="/api/memories", tags=["memories"])
categories_router = APIRouter(prefix="/api/categories", tags=["categories"])

Reader = Annotated[MnemoryCaller, Depends(reader)]
Writer = Annotated[MnemoryCaller, Depends(writer)]
MemoryId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]


def _body(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(mode="json", exclude={"caller_agent_id"}))


@router.post("", response_model=AddMemoryResponse)
async def add_memory(request: Request, req: AddMemoryRequest, who: Writer) -> dict[str, Any]:
    """Add a memory."""
    return await upstream.call(request, "ingest", "mnemory_add", who, _body(req))


@router.post("/batch", response_model=list[AddMemoryResponse])
async def add_memories_batch(request: Request, req: AddMemoriesBatchRequest, who: Writer) -> list[dict[str, Any]]:
    """Batch add memories: one response per item, a failed item answered in place."""
    reply = await upstream.call(request, "ingest", "mnemory_add_batch", who, _body(req))
    items: list[dict[str, Any]] = reply["items"]
    return items


@router.post("/search", response_model=SearchMemoriesResponse)
async def search_memories(request: Request, req: SearchMemoriesRequest, who: Reader) -> dict[str, Any]:
    """Semantic search."""
    return await upstream.call(request, "recall", "mnemory_search", who, _body(req))


@router.post("/find", response_model=SearchMemoriesResponse)
async def find_memories(request: Request, req: FindMemoriesRequest, who: Reader) -> dict[str, Any]:
    """Multi-query search: sub-queries from the configured LLM, else the deterministic fallback (README)."""
    return await upstream.call(request, "recall", "mnemory_find", who, _body(req))


@router.get("/core", response_model=CoreMemoriesResponse, response_model_exclude_none=True)
async def get_core_memories(
    request: Request, who: Reader,
    recent_days: Annotated[int, Query(ge=0, le=3650, description="Days of recent context")] = 7,
    include_stats: Annotated[bool, Query(description="Include structured core-memory stats")] = False,
    include_raw: Annotated[bool, Query(description="Also include raw (unconsolidated) memories")] = False,
) -> dict[str, Any]:
    """Core memories (pinned + recent); memory_layer=raw excluded by default."""
    reply = await upstream.call(request, "recall", "mnemory_core", who, {
        "recent_days": recent_days, "include_stats": include_stats, "include_raw": include_raw})
    return {"text": reply["text"], "stats": reply.get("stats")}


@router.get("/recent", response_model=TextResponse)
async def get_recent_memories(
    request: Request, who: Reader,
    days: Annotated[int, Query(ge=0, le=3650, description="Days back to look")] = 7,
    scope: Annotated[Literal["all", "user", "agent"], Query(description="Scope: all, user, agent")] = "all",
    limit: Annotated[int, Query(ge=1, le=100, description="Max results per scope")] = 25,
    include_decayed: Annotated[bool, Query(description="Include expired memories")] = False,
) -> dict[str, Any]:
    """Recent memories."""
    return await upstream.call(request, "recall", "mnemory_recent", who, {
        "days": days, "scope": scope, "limit": limit, "include_decayed": include_decayed})


@router.get("", response_model=SearchMemoriesResponse)
async def list_memories(
    request: Request, who: Reader,
    memory_type: Annotated[str | None, Query(max_length=32, description="Filter by type")] = None,
    categories: Annotated[str | None, Query(max_length=2000, description="Comma-separated categories")] = None,
    role: Annotated[str | None, Query(max_length=32, description="Filter by role")] = None,
    limit: Annotated[int, Query(ge=1, le=5000, description="Max results")] = 50,
    include_decayed: Annotated[bool, Query(description="Include expired memories")] = False,
    sort: Annotated[Literal["newest", "oldest"] | None, Query(description="newest (default) or oldest")] = None,
    labels: Annotated[str | None, Query(max_length=4000, description='Labels as a JSON object, e.g. {"source":"web"}')] = None,
    memory_layer: Annotated[str | None, Query(max_length=32, description='"raw" or "consolidated"')] = None,
) -> dict[str, Any]:
    """List memories."""
    if memory_layer and memory_layer not in ("raw", "consolidated"):
        raise HTTPException(status_code=422, detail="memory_layer must be 'raw' or 'consolidated'")
    labels_dict = None
    if labels:
        try:
            labels_dict = json.loads(labels)
        except json.JSONDecodeError:
            raise HTTPException(status_code=422, detail="Invalid JSON in labels parameter") from None
        if not isinstance(labels_dict, dict):
            raise HTTPException(status_code=422, detail="labels must be a JSON object")
    return await upstream.call(request, "recall", "mnemory_list", who, {
        "memory_type": memory_type, "categories": [c.strip() for c in categories.split(",")] if categories else None,
        "role": role, "limit": limit, "include_decayed": include_decayed, "sort": sort, "labels": labels_dict,
        "memory_layer": memory_layer,
    })


@router.post("/by-ids", response_model=SearchMemoriesResponse)
async def get_memories_by_ids(request: Request, req: GetMemoriesByIdsRequest, who: Reader) -> dict[str, Any]:
    """Fetch memories by ID list (missing or foreign ids are skipped)."""
    return await upstream.call(request, "recall", "mnemory_by_ids", who, _body(req))


@router.put("/{memory_id}", response_model=StatusResponse)
async def update_memory(request: Request, memory_id: MemoryId, req: UpdateMemoryRequest, who: Writer) -> dict[str, Any]:
    """Update memory."""
    return await upstream.call(request, "ingest", "mnemory_update", who, {**_body(req), "memory_id": memory_id})


@router.delete("/{memory_id}", response_model=StatusResponse)
async def delete_memory(request: Request, memory_id: MemoryId, who: Writer) -> dict[str, Any]:
    """Delete memory."""
    return await upstream.call(request, "ingest", "mnemory_delete", who, {"memory_id": memory_id})


@categories_router.get("", response_model=ListCategoriesResponse)
async def list_categories(request: Request, who: Reader) -> dict[str, Any]:
    """List categories with memory counts."""
    return await upstream.call(request, "recall", "mnemory_categories", who, {})
