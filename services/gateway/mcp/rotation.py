"""Session id rotation: POST /session/rotate and the session_rotate tool.

seed: Bearer required; 403 when the session is not the caller's; Origin required and on the
allow-list (else 403, CSRF); MEMENTO_ROTATE_RATE_LIMIT_PER_MIN per IP (default 5, else 429);
reason <= 128 characters, default `explicit_rotate`; state is kept, only the id changes.
"""

from __future__ import annotations

import fnmatch
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from prometheus_client import Counter

from services.gateway.core.scope import PRINCIPAL_SCOPE_KEY
from services.gateway.core.state import gateway_state
from services.gateway.core.wire import unauthorized
from services.gateway.sessions import ActiveSession, Sessions
from shared.metrics import OTHER

logger = logging.getLogger(__name__)

ROTATIONS = Counter("mcp_session_rotation_total", "MCP session ids rotated", ["reason"])
ROTATE_RATE_LIMITED = Counter("mcp_rotate_rate_limited_total", "POST /session/rotate refused by the per-IP limit")

DEFAULT_REASON = "explicit_rotate"
# seed: the reasons it names ("scheduled_rotation", "suspected_leak", "user_request").
LABELLED_REASONS = frozenset({DEFAULT_REASON, "scheduled_rotation", "suspected_leak", "user_request"})
MAX_HTTP_REASON = 128
# Default Origin allow-list when ALLOWED_ORIGINS is not set: the local machine.
LOCAL_ORIGINS = ("http://localhost", "http://localhost:*", "http://127.0.0.1", "http://127.0.0.1:*", "http://[::1]", "http://[::1]:*")

router = APIRouter()


def origin_allowed(origin: str, allowed: list[str]) -> bool:
    patterns = allowed or list(LOCAL_ORIGINS)
    return any(origin == p or fnmatch.fnmatchcase(origin, p) for p in patterns)


async def rotate(sessions: Sessions, session: ActiveSession, presented_id: str, reason: str) -> dict[str, Any]:
    new_id = await sessions.rotate(session, reason)
    old_id = presented_id
    # The reason is the caller's free text: only the reference's named ones become a label value.
    ROTATIONS.labels(reason if reason in LABELLED_REASONS else OTHER).inc()
    logger.info("session rotated (%s): %s -> %s", reason, old_id, new_id)
    return {
        "ok": True,
        "oldSessionId": old_id,
        "newSessionId": new_id,
        "reason": reason,
        "rotatedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


@router.post("/session/rotate")
async def rotate_endpoint(request: Request) -> JSONResponse:
    state = gateway_state(request)
    client = request.client.host if request.client else "unknown"
    allowed, retry = await state.limiter.hit("rotate", client, state.settings.rotate_rate_limit_per_min)
    if not allowed:
        ROTATE_RATE_LIMITED.inc()
        return JSONResponse({"ok": False, "error": "Too Many Requests"}, status_code=429, headers={"Retry-After": str(retry)})
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is None:
        return unauthorized(request.scope)
    origin = request.headers.get("origin")
    if not origin or not origin_allowed(origin, state.settings.allowed_origins):
        return JSONResponse({"ok": False, "error": "Origin not allowed"}, status_code=403)
    session_id = request.headers.get("mcp-session-id")
    if not session_id:
        return JSONResponse({"ok": False, "error": "Mcp-Session-Id header required"}, status_code=400)
    session = await state.sessions.resolve(session_id)
    if session is None:
        return JSONResponse({"ok": False, "error": "Session not found"}, status_code=404)
    if session.key_id != principal.key_id:
        return JSONResponse({"ok": False, "error": "Forbidden"}, status_code=403)
    reason = DEFAULT_REASON
    if await request.body():
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"ok": False, "error": "invalid JSON body"}, status_code=400)
        supplied = body.get("reason") if isinstance(body, dict) else None
        if supplied is not None:
            if not isinstance(supplied, str) or len(supplied) > MAX_HTTP_REASON:
                error = f"reason must be a string of at most {MAX_HTTP_REASON} characters"
                return JSONResponse({"ok": False, "error": error}, status_code=400)
            reason = supplied or DEFAULT_REASON
    return JSONResponse(await rotate(state.sessions, session, session_id, reason))
