"""/api/sessions: reference 004's session summaries (written by /api/remember's job)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from services.gateway.mnemory_api import upstream
from services.gateway.mnemory_api.auth import MnemoryCaller, reader, writer
from services.gateway.mnemory_api.schemas import SessionDetail, SessionListResponse
from shared.domain.fragment import MAX_ID_CHARS

# Past any store's size and inside Postgres' bigint: a larger offset is a 422, not a 500.
MAX_OFFSET = 2**31 - 1
router = APIRouter(prefix="/api/sessions", tags=["sessions"])

Reader = Annotated[MnemoryCaller, Depends(reader)]
Writer = Annotated[MnemoryCaller, Depends(writer)]
SessionId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS)]


@router.get("", response_model=SessionListResponse, response_model_exclude_none=True)
async def list_sessions(
    request: Request, who: Reader,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,  # Postgres' OFFSET is a bigint
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    consolidation_state: Annotated[str | None, Query(max_length=32)] = None,
    q: Annotated[str | None, Query(max_length=1000, description="Case-insensitive substring of the summary or session ID")] = None,
    sort_by: Annotated[Literal["updated_at", "created_at"], Query()] = "updated_at",
    sort_dir: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> dict[str, Any]:
    """List session summaries with pagination, search, and sorting."""
    return await upstream.call(request, "recall", "mnemory_sessions", who, {
        "offset": offset, "limit": limit, "consolidation_state": consolidation_state, "q": q,
        "sort_by": sort_by, "sort_dir": sort_dir,
    })


@router.get("/{session_id}", response_model=SessionDetail, response_model_exclude_none=True)
async def get_session(request: Request, session_id: SessionId, who: Reader) -> dict[str, Any]:
    """Get a single session summary."""
    return await upstream.call(request, "recall", "mnemory_session", who, {"session_id": session_id})


@router.delete("/{session_id}")
async def delete_session(
    request: Request, session_id: SessionId, who: Writer, delete_memories: Annotated[bool, Query()] = False,
) -> dict[str, Any]:
    """Delete a session summary (delete_memories=true also deletes its raw memories)."""
    return await upstream.call(request, "ingest", "mnemory_session_delete", who, {
        "session_id": session_id, "delete_memories": delete_memories})


@router.post("/{session_id}/consolidate")
async def consolidate_session(request: Request, session_id: SessionId, who: Writer) -> dict[str, Any]:
    """Consolidate one session now and return the result."""
    return await upstream.call(request, "ingest", "mnemory_session_consolidate", who, {"session_id": session_id})
