"""Live MCP sessions on this gateway: who owns them, their mode, their current segment.

seed: a fragment's session_id is `{transportId}#{seq}` (MEMENTO_SESSION_SEGMENT, default
on); the segment rotates after idle time or a maximum lifetime, and the segment it replaces
is handed to reflect. Session rows are written through shared/repositories/sessions.py; the
reflect job ("maintenance.auto_reflect") is sent only after the row that ends is committed,
and only for a segment that saw a tool call (an unused one is ended and left to the sweep).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import asyncpg
from celery import Celery
from prometheus_client import Counter, Gauge

from shared.domain.principal import Principal
from shared.jobs import JobBuffer
from shared.repositories import sessions as sessions_repo
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

AUTO_REFLECT_TASK = "maintenance.auto_reflect"

SESSIONS_OPEN = Gauge("mcp_sessions_active", "Open MCP sessions on this gateway", ["transport"])
SEGMENT_ROTATIONS = Counter("mcp_session_segment_rotation_total", "Session segments rotated", ["reason"])

Transport = Literal["streamable-http", "sse"]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class GatewaySession:
    session_id: str  # the id the client uses (Mcp-Session-Id / SSE sessionId); rotate changes it
    transport: Transport
    principal: Principal
    token_digest: str | None
    mode: str | None
    seq: int = 1
    segment_started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    activity: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100))
    closed: bool = False
    # Tool calls in the current segment; a segment nobody used is not worth a reflect job.
    segment_calls: int = 0
    # Serialises segment rotation between concurrent calls of one session.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def segment_id(self, segmented: bool) -> str:
        return f"{self.session_id}#{self.seq}" if segmented else self.session_id


class SessionRegistry:
    def __init__(self, settings: GatewaySettings, pool: asyncpg.Pool, celery: Celery | None) -> None:
        self.settings = settings
        self.pool = pool
        self.celery = celery
        self.by_id: dict[str, GatewaySession] = {}
        # seed: token-based reuse - the same Bearer without a session id gets its session back.
        self.by_token: dict[str, str] = {}
        # Called with a session id once it is closed (the app drops rotated transports).
        self.on_close: Any = None

    @property
    def segmented(self) -> bool:
        return self.settings.session_segment

    def get(self, session_id: str | None) -> GatewaySession | None:
        return self.by_id.get(session_id) if session_id else None

    def for_token(self, token: str | None, transport: Transport) -> GatewaySession | None:
        if not token:
            return None
        session = self.by_id.get(self.by_token.get(token_digest(token), ""))
        if session is None or session.closed or session.transport != transport:
            return None
        return session

    async def open(
        self, session_id: str, transport: Transport, principal: Principal, token: str | None, mode: str | None
    ) -> GatewaySession:
        existing = self.by_id.get(session_id)
        if existing is not None:  # a reused session re-initialized: keep its state
            if mode:
                existing.mode = mode
            return existing
        session = GatewaySession(session_id, transport, principal, token_digest(token) if token else None, mode)
        self.by_id[session_id] = session
        if session.token_digest:
            self.by_token[session.token_digest] = session_id
        SESSIONS_OPEN.labels(transport).inc()
        async with self.pool.acquire() as conn:
            await self._start_row(conn, session)
        return session

    async def _start_row(self, conn: asyncpg.Connection, session: GatewaySession, previous_id: str | None = None) -> None:
        await sessions_repo.start(
            conn, session_id=session.segment_id(self.segmented), transport_id=session.session_id,
            key_id=session.principal.key_id, workspace=session.principal.default_workspace,
            mode=session.mode, seq=session.seq, previous_id=previous_id,
        )

    async def current_segment(self, session: GatewaySession, tool: str) -> str:
        """The segment id this call belongs to, rotating the segment first when it went idle
        or outlived its lifetime."""
        async with session.lock:
            now = time.monotonic()
            reason = None
            if self.segmented:
                if now - session.last_activity > self.settings.segment_idle.total_seconds():
                    reason = "segment_idle"
                elif now - session.segment_started > self.settings.segment_lifetime.total_seconds():
                    reason = "segment_lifetime"
            if reason is not None:
                old = session.segment_id(True)
                session.seq += 1
                session.segment_started = now
                SEGMENT_ROTATIONS.labels(reason).inc()
                await self._hand_over(session, old, reason)
            session.last_activity = now
            session.segment_calls += 1
            segment = session.segment_id(self.segmented)
            entry = {"tool": tool, "at": datetime.now(timezone.utc).isoformat()}
            session.activity.append(entry)
            async with self.pool.acquire() as conn:
                await sessions_repo.record_activity(conn, segment, entry)
            return segment

    async def rotate(self, session: GatewaySession, reason: str) -> tuple[str, str]:
        """Give the session a new id; its state stays. The old id's segment ends and is reflected."""
        async with session.lock:
            old_id = session.session_id
            old_segment = session.segment_id(self.segmented)
            new_id = uuid.uuid4().hex
            session.session_id = new_id
            session.seq = 1
            session.segment_started = time.monotonic()
            self.by_id[new_id] = self.by_id.pop(old_id)
            if session.token_digest and self.by_token.get(session.token_digest) == old_id:
                self.by_token[session.token_digest] = new_id
            await self._hand_over(session, old_segment, reason)
            return old_id, new_id

    async def _hand_over(self, session: GatewaySession, old_segment: str, reason: str) -> None:
        """End the old segment's row and start the session's new one in one transaction;
        the ended segment goes to reflect if it saw a tool call."""
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                ended = await sessions_repo.end(conn, old_segment, reason)
                await self._start_row(conn, session, previous_id=old_segment)
        if ended and session.segment_calls:
            await self._reflect(old_segment, session.principal.key_id, reason)
        session.segment_calls = 0

    async def close(self, session_id: str, reason: str) -> None:
        session = self.by_id.pop(session_id, None)
        if session is None or session.closed:
            return
        session.closed = True
        SESSIONS_OPEN.labels(session.transport).dec()
        if session.token_digest and self.by_token.get(session.token_digest) == session_id:
            del self.by_token[session.token_digest]
        if self.on_close is not None:
            self.on_close(session_id)
        segment = session.segment_id(self.segmented)
        async with self.pool.acquire() as conn:
            ended = await sessions_repo.end(conn, segment, reason)
        if ended and session.segment_calls:
            await self._reflect(segment, session.principal.key_id, reason)

    async def _reflect(self, segment_id: str, key_id: str | None, reason: str) -> None:
        """Ask maintenance to reflect an ended segment; its row is committed by now."""
        jobs = JobBuffer()
        jobs.add(AUTO_REFLECT_TASK, session_id=segment_id, key_id=key_id, reason=reason)
        # send_task does blocking broker I/O; keep it off the event loop.
        unsent = await asyncio.to_thread(jobs.send, self.celery)
        if unsent:
            # The row stays ended and unreflected; maintenance's sweep of such rows picks it up.
            logger.info("auto reflect of %s not enqueued (no broker); left for the sweep", segment_id)
