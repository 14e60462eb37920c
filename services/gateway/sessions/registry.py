"""MCP sessions on this gateway: the logical (memento) session behind each transport session.

seed: a fragment's session_id is `{transportId}#{seq}` (MEMENTO_SESSION_SEGMENT, default
on); the segment rotates after idle time or a maximum lifetime, and the segment it replaces
is handed to reflect. Session rows are written through shared/repositories/sessions.py; the
reflect job ("maintenance.auto_reflect") is sent only after the row that ends is committed,
and only for a segment that saw a tool call (an unused one is ended and left to the sweep).

Transport session vs logical session. A transport session is what the SDK serves: one
Mcp-Session-Id (or SSE stream) with its own JSON-RPC ids. The logical session is what
memory sees: its id names the segments `{id}#{seq}`, and it carries the mode and the
activity. seed "token-based session reuse": a client that reconnects with the same Bearer
and no Mcp-Session-Id gets its session back. Its `initialize` opens a new transport session
(so two live clients of one key never share JSON-RPC ids or replies) that inherits the
logical session of the key's most recently active session that is *idle*: no request or
GET stream of it is open, and either a GET stream of it has closed since it attached (an
SDK client holds one for as long as it lives) or nothing of it has been open for
QUIET_SECONDS (a client that never opens one). A session ended by DELETE or by its idle timeout is over and is not
inherited. The logical session ends when its last transport session ends.

Activity is kept in memory and written to the session row in the background (every
ACTIVITY_FLUSH_SECONDS, and before a row ends), so a tool call costs no database write.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
SESSIONS_RESUMED = Counter("mcp_session_resumed_total", "initialize requests that continued a session of the same Bearer")

Transport = Literal["streamable-http", "sse"]

# A session whose client never opened a GET stream (or has not yet: an SDK client opens it
# right after initialize) counts as live until nothing of it has been open this long.
QUIET_SECONDS = 30.0
# Session rows learn their activity this often; a crash loses at most this much of it.
ACTIVITY_FLUSH_SECONDS = 1.0


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class GatewaySession:
    session_id: str  # the logical id: segments are `{session_id}#{seq}`; rotate changes it
    transport: Transport
    principal: Principal
    token_digest: str | None
    mode: str | None
    seq: int = 1
    segment_started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    activity: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100))
    closed: bool = False
    # Tool calls in the current segment; a segment nobody used is not worth a reflect job.
    segment_calls: int = 0
    # Serialises segment rotation between concurrent calls of one session.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Every id a client may present for this session -> the transport session it reaches.
    ids: dict[str, str] = field(default_factory=dict)
    # Live transport sessions (the SDK's ids) attached to this logical session.
    transports: set[str] = field(default_factory=set)
    # Requests and GET streams open right now, over all its transports.
    open_requests: int = 0
    quiet_since: float = field(default_factory=time.monotonic)
    stream_closed_since_attach: bool = False
    # Activity entries not yet written to the row of `pending_segment`.
    pending: list[dict[str, Any]] = field(default_factory=list)
    pending_segment: str | None = None

    def segment_id(self, segmented: bool) -> str:
        return f"{self.session_id}#{self.seq}" if segmented else self.session_id

    def idle(self, now: float) -> bool:
        if self.closed or self.open_requests > 0:
            return False
        return self.stream_closed_since_attach or now - self.quiet_since > QUIET_SECONDS


class SessionRegistry:
    def __init__(self, settings: GatewaySettings, pool: asyncpg.Pool, celery: Celery | None) -> None:
        self.settings = settings
        self.pool = pool
        self.celery = celery
        # Every id a client may present (transport ids, ids issued by rotate) -> its session.
        self.by_id: dict[str, GatewaySession] = {}
        # Ids a rotate replaced: they still reach the session, but only with its credential.
        self.retired: set[str] = set()
        # seed: token-based reuse. Token digest -> its open sessions, and the transport the
        # latest of them attached (where a request without Mcp-Session-Id goes).
        self.by_token: dict[str, list[GatewaySession]] = {}
        self.latest_transport: dict[str, str] = {}
        self._flusher: asyncio.Task[None] | None = None
        # Ends a transport session whose logical session a reconnect took over (set by the app).
        self.on_handover: Any = None

    @property
    def segmented(self) -> bool:
        return self.settings.session_segment

    def sessions(self) -> list[GatewaySession]:
        unique = {id(s): s for s in self.by_id.values()}
        return list(unique.values())

    def get(self, session_id: str | None) -> GatewaySession | None:
        return self.by_id.get(session_id) if session_id else None

    def speaks_for(self, session_id: str | None) -> GatewaySession | None:
        """The session an id alone stands for (no credential): not an id a rotate replaced."""
        if not session_id or session_id in self.retired:
            return None
        return self.by_id.get(session_id)

    def for_token(self, token: str | None, transport: Transport) -> str | None:
        """The transport id a request of this Bearer without a session id belongs to."""
        if not token:
            return None
        transport_id = self.latest_transport.get(token_digest(token))
        session = self.by_id.get(transport_id or "")
        if session is None or session.closed or session.transport != transport:
            return None
        return transport_id

    def _resumable(self, digest: str | None, transport: Transport) -> GatewaySession | None:
        if digest is None:
            return None
        now = time.monotonic()
        candidates = [s for s in self.by_token.get(digest, []) if s.transport == transport and s.idle(now)]
        return max(candidates, key=lambda s: s.last_activity, default=None)

    async def open(
        self, transport_id: str, transport: Transport, principal: Principal, token: str | None, mode: str | None,
        *, mode_given: bool = False,
    ) -> GatewaySession:
        """Attach a new transport session: to the Bearer's idle session when there is one
        (Streamable HTTP), else to a new logical session named after the transport."""
        existing = self.by_id.get(transport_id)
        if existing is not None:  # re-initialized on the same transport: keep its state
            if mode_given:
                existing.mode = mode
            return existing
        digest = token_digest(token) if token else None
        session = self._resumable(digest, transport) if transport == "streamable-http" else None
        if session is not None:
            SESSIONS_RESUMED.inc()
            session.principal = principal
            if mode_given:
                session.mode = mode
            # The client that left is gone: its transport sessions end without ending this one.
            for previous in list(session.transports):
                self._detach(session, previous)
                if self.on_handover is not None:
                    await self.on_handover(previous)
            logger.info("transport %s continues session %s", transport_id, session.session_id)
        else:
            session = GatewaySession(transport_id, transport, principal, digest, mode)
            SESSIONS_OPEN.labels(transport).inc()
            if digest:
                self.by_token.setdefault(digest, []).append(session)
            async with self.pool.acquire() as conn:
                await self._start_row(conn, session)
        self._attach(session, transport_id)
        return session

    def _attach(self, session: GatewaySession, transport_id: str) -> None:
        session.transports.add(transport_id)
        session.ids[transport_id] = transport_id
        session.quiet_since = time.monotonic()
        session.stream_closed_since_attach = False
        self.by_id[transport_id] = session
        if session.token_digest:
            self.latest_transport[session.token_digest] = transport_id

    def request_started(self, session: GatewaySession) -> None:
        session.open_requests += 1

    def request_ended(self, session: GatewaySession, stream: bool) -> None:
        session.open_requests -= 1
        session.quiet_since = time.monotonic()
        if stream:
            session.stream_closed_since_attach = True

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
            entry = {"tool": tool, "at": datetime.now(UTC).isoformat()}
            session.activity.append(entry)
            session.pending.append(entry)
            session.pending_segment = segment
            self._ensure_flusher()
            return segment

    # -- activity, written behind the calls ----------------------------------------------
    def _ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(ACTIVITY_FLUSH_SECONDS)
            dirty = [s for s in self.sessions() if s.pending]
            if not dirty:
                return  # restarted by the next tool call
            try:
                async with self.pool.acquire() as conn:
                    for session in dirty:
                        await self._flush(conn, session)
            except (asyncpg.PostgresError, OSError):
                logger.warning("session activity not written; retrying", exc_info=True)

    async def _flush(self, conn: asyncpg.Connection, session: GatewaySession) -> None:
        entries, segment = session.pending, session.pending_segment
        session.pending = []
        if segment and entries:
            await sessions_repo.record_activity(conn, segment, entries)

    async def flush_all(self) -> None:
        """Write every pending activity entry now (an admin view, shutdown)."""
        dirty = [s for s in self.sessions() if s.pending]
        if dirty:
            async with self.pool.acquire() as conn:
                for session in dirty:
                    await self._flush(conn, session)

    async def aclose(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await self.flush_all()

    # -- rotation and the end of a session -----------------------------------------------
    async def rotate(self, session: GatewaySession, presented_id: str, reason: str) -> tuple[str, str]:
        """Give the session a new id; its state stays. The old segment ends and is reflected.
        The ids it had keep reaching it, but only with its credential (seed: the new id
        replaces the one that may have leaked; the client's connection is not disturbed)."""
        async with session.lock:
            old_segment = session.segment_id(self.segmented)
            new_id = uuid.uuid4().hex
            transport_id = session.ids.get(presented_id, presented_id)
            self.retired.update(session.ids)
            session.session_id = new_id
            session.seq = 1
            session.segment_started = time.monotonic()
            session.ids[new_id] = transport_id
            self.by_id[new_id] = session
            await self._hand_over(session, old_segment, reason)
            return presented_id, new_id

    async def _hand_over(self, session: GatewaySession, old_segment: str, reason: str) -> None:
        """End the old segment's row and start the session's new one in one transaction;
        the ended segment goes to reflect if it saw a tool call."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._flush(conn, session)
            ended = await sessions_repo.end(conn, old_segment, reason)
            await self._start_row(conn, session, previous_id=old_segment)
        if ended and session.segment_calls:
            await self._reflect(old_segment, session.principal.key_id, reason)
        session.segment_calls = 0

    @staticmethod
    def client_id(session: GatewaySession, transport_id: str) -> str:
        """The id a client of this transport session was given last (a rotate issues one)."""
        given = [i for i, t in session.ids.items() if t == transport_id]
        return given[-1] if given else transport_id

    def transport_of(self, session_id: str) -> str | None:
        session = self.by_id.get(session_id)
        return session.ids.get(session_id) if session is not None else None

    def _detach(self, session: GatewaySession, transport_id: str) -> None:
        session.transports.discard(transport_id)
        for client_id in [i for i, t in session.ids.items() if t == transport_id]:
            del session.ids[client_id]
            self.by_id.pop(client_id, None)
            self.retired.discard(client_id)
        digest = session.token_digest
        if digest and self.latest_transport.get(digest) == transport_id:
            if session.transports:
                self.latest_transport[digest] = next(iter(session.transports))
            else:
                del self.latest_transport[digest]

    async def close(self, transport_id: str, reason: str) -> None:
        """A transport session ended; the logical session ends with its last transport."""
        session = self.by_id.get(transport_id)
        if session is None or transport_id not in session.transports:
            return
        self._detach(session, transport_id)
        if session.transports or session.closed:
            return
        digest = session.token_digest
        session.closed = True
        SESSIONS_OPEN.labels(session.transport).dec()
        if digest:
            remaining = [s for s in self.by_token.get(digest, []) if s is not session]
            if remaining:
                self.by_token[digest] = remaining
            else:
                self.by_token.pop(digest, None)
        segment = session.segment_id(self.segmented)
        async with self.pool.acquire() as conn:
            await self._flush(conn, session)
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
