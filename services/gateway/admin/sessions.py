"""Admin REST: MCP sessions (seed: GET /sessions with activity and the unreflected count,
GET / DELETE /sessions/:id, POST /sessions/cleanup; master key only).

A session is listed by its logical id (the transport id its segment rows carry, the
Mcp-Session-Id it was opened with or its rotated id); its segments `{id}#{seq}` are the
rows fragments name. Rows come from this gateway's pool (as the reflect routes' do), live
state from the session store (services/gateway/sessions/), search events and tool feedback
from recall. Ending a session goes through the session owner, so every replica sees it end
and the ended segment goes to reflect like any other ending.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request

from services.gateway.admin.admin_auth import require_master
from services.gateway.admin.upstream import view
from services.gateway.core.state import gateway_state
from services.gateway.sessions import ActiveSession
from services.gateway.sessions.model import doc_key
from shared.repositories import admin_views as views
from shared.repositories.maintenance import MAX_REFLECT_ATTEMPTS

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

END_REASON = "admin_end"
CLEANUP_REASON = "expired"
RECENT_CALLS = 20


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _activity(rows: list[Any]) -> dict[str, Any]:
    """seed "activity enrichment": which tools a session called, how often, and when last."""
    calls: list[dict[str, Any]] = []
    for row in rows:
        entries = row["activity"]
        if isinstance(entries, str):
            entries = json.loads(entries)
        calls.extend({**e, "segment": row["id"]} for e in entries or [])
    counts = Counter(str(c.get("tool")) for c in calls)
    return {
        "toolCalls": dict(counts.most_common()),
        "totalCalls": len(calls),
        "lastTool": calls[-1].get("tool") if calls else None,
        "lastCallAt": calls[-1].get("at") if calls else None,
        "recent": calls[-RECENT_CALLS:],
    }


def _session(rows: list[Any], idle: timedelta, doc: dict[str, Any] | None) -> dict[str, Any]:
    """One logical session from its segment rows (oldest first) and its live document."""
    first, last = rows[0], rows[-1]
    open_rows = [r for r in rows if r["ended_at"] is None]
    current = open_rows[-1] if open_rows else last
    last_used = max(r["last_activity_at"] for r in rows)
    return {
        "sessionId": first["transport_id"] or first["id"],
        # The reference's two transports, from the live document (rows do not record it).
        "type": "legacy" if doc is not None and doc.get("transport") == "sse" else "streamable",
        "live": doc is not None,
        "authenticated": True,
        "keyId": first["key_id"],
        "keyName": first["key_name"],
        "workspace": current["workspace"],
        "mode": current["mode"],
        "status": "active" if open_rows else "ended",
        "createdAt": _iso(first["started_at"]),
        "lastAccessedAt": _iso(last_used),
        "expiresAt": _iso(last_used + idle) if open_rows else None,
        "endedAt": _iso(last["ended_at"]) if not open_rows else None,
        "endReason": last["end_reason"] if not open_rows else None,
        "currentSegment": current["id"],
        "segments": [
            {"id": r["id"], "seq": r["seq"], "startedAt": _iso(r["started_at"]), "endedAt": _iso(r["ended_at"]),
             "endReason": r["end_reason"], "reflectedAt": _iso(r["reflected_at"]), "reflectError": r["reflect_error"]}
            for r in rows
        ],
        "unreflectedSegments": sum(1 for r in rows if r["ended_at"] is not None and r["reflected_at"] is None),
        "activity": _activity(rows),
    }


@router.get("/sessions")
async def list_sessions(request: Request, status: Literal["active", "ended", "all"] = "active", limit: int = 100) -> dict[str, Any]:
    state = gateway_state(request)
    await state.sessions.flush_all()  # this replica's latest tool calls are in the rows
    idle = state.settings.session_idle_timeout
    async with state.pool.acquire() as conn:
        rows = await views.session_segments(conn, status=status, limit=max(1, min(limit, 1000)))
        unreflected = await views.unreflected_count(conn, MAX_REFLECT_ATTEMPTS)
        open_count = (await views.gateway_counts(conn))["open_sessions"]
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row["transport_id"], []).append(row)
    docs = await state.sessions.store.get_many([doc_key(t) for t in grouped])
    sessions = [_session(segment_rows, idle, doc) for segment_rows, doc in zip(grouped.values(), docs, strict=True)]
    return {
        "sessions": sessions,
        "counts": {
            "streamable": sum(1 for s in sessions if s["status"] == "active" and s["type"] == "streamable"),
            "legacy": sum(1 for s in sessions if s["status"] == "active" and s["type"] == "legacy"),
            "total": open_count,
            "unreflected": unreflected,
        },
    }


async def _rows(request: Request, session_id: str) -> list[Any]:
    async with gateway_state(request).pool.acquire() as conn:
        return await views.session_rows(conn, session_id)


@router.get("/sessions/{session_id}")
async def session_detail(request: Request, session_id: str) -> dict[str, Any]:
    """seed: the session with its search events and tool feedback."""
    state = gateway_state(request)
    await state.sessions.flush_all()
    rows = await _rows(request, session_id)
    if not rows:
        raise HTTPException(status_code=404, detail="Session not found")
    live = await _live(request, rows[0]["transport_id"] or session_id)
    detail = _session(rows, state.settings.session_idle_timeout, live.doc if live is not None else None)
    events = await view(request, "admin_session_events", {"session_id": rows[0]["transport_id"] or session_id})
    return {**detail, **events}


async def _live(request: Request, session_id: str) -> ActiveSession | None:
    """The live session an id names: a client id, or the handle its document is kept under."""
    sessions = gateway_state(request).sessions
    found = await sessions.resolve(session_id, touch=False)
    if found is not None:
        return found
    doc = await sessions.store.get(doc_key(session_id))
    if doc is None:
        return None
    return ActiveSession(session_id, session_id, False, doc)


@router.delete("/sessions/{session_id}")
async def end_session(request: Request, session_id: str) -> dict[str, Any]:
    """seed: end the session. Its ids stop working on every replica; its open segment is
    ended and handed to reflect (when it saw a tool call), as any ending is."""
    state = gateway_state(request)
    rows = await _rows(request, session_id)
    transport_id = rows[0]["transport_id"] if rows else session_id
    live = await _live(request, transport_id) or (await _live(request, session_id) if transport_id != session_id else None)
    if live is None and not rows:
        raise HTTPException(status_code=404, detail="Session not found")
    if live is not None:
        await state.sessions.end(live, END_REASON)
    # Rows a dead replica left open (no live document ends them).
    async with state.pool.acquire() as conn:
        orphans = await views.end_session_rows(conn, transport_id, END_REASON)
    return {"ok": True, "sessionId": transport_id, "wasLive": live is not None, "endedSegments": orphans}


@router.post("/sessions/cleanup")
async def cleanup_sessions(request: Request) -> dict[str, Any]:
    """seed: clean up expired sessions now: end every session idle for
    MEMENTO_SESSION_IDLE_TIMEOUT (what each replica's sweep does), then the open rows of
    sessions no replica holds any more. Ended segments are reflected by the sweep."""
    state = gateway_state(request)
    idle = state.settings.session_idle_timeout.total_seconds()
    async with state.pool.acquire() as conn:
        before = (await views.gateway_counts(conn))["open_sessions"]
    await state.sessions.sweep_idle()
    async with state.pool.acquire() as conn:
        orphans = await views.end_stale_sessions(conn, idle, CLEANUP_REASON)
        after = (await views.gateway_counts(conn))["open_sessions"]
    return {"ok": True, "message": "Cleanup completed", "ended": max(0, before - after), "orphanSegments": len(orphans)}
