"""MCP session identity, kept in a SessionStore (Redis, or this process without it) so that
any gateway replica serves any request of a session.

seed: a fragment's session_id is `{transportId}#{seq}` (MEMENTO_SESSION_SEGMENT, default
on); the segment rotates after idle time or a maximum lifetime, and the segment it replaces
is handed to reflect. Session rows are written through shared/repositories/sessions.py; the
reflect job ("maintenance.auto_reflect") is sent only after the row that ends is committed,
and only for a segment that saw a tool call (an unused one is ended and left to the sweep).

Client ids and logical sessions. A client id is what a client presents (Mcp-Session-Id, or
the legacy SSE sessionId): one per connection of a client, so two live clients of one key
never share JSON-RPC ids. The logical session is what memory sees: its id names the segments
`{id}#{seq}`, and it carries the mode and the activity. seed "token-based session reuse": a
client that reconnects with the same Bearer and no Mcp-Session-Id gets its session back. Its
`initialize` gets a client id of its own that continues the logical session of the key's most
recently used session that is *idle*: no GET stream of it is open, and either a GET stream of
it has closed since the last client attached (an SDK client holds one for as long as it
lives) or it has not been used for QUIET_SECONDS (a client that never opens one). The client
it takes over is over (its id answers 404). A session ended by DELETE or by its idle timeout
is over and is not inherited. The logical session ends when its last client id ends.

Store layout (every key expires unless used; the idle sweep ends a session before that):
`gw:session:{handle}` the session document, `gw:session-id:{client id}` -> handle,
`gw:session-token:{token digest}` -> the key's sessions and its latest client id per transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from cachetools import LRUCache
from celery import Celery
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from services.gateway.core.round_trip import RoundTrip
from services.gateway.sessions.model import (
    ActiveSession,
    SessionGone,
    Transport,
    activity_key,
    doc_key,
    id_key,
    segment_of,
    token_digest,
    token_key,
)
from services.gateway.sessions.store import (
    RECORDED,
    REFUSED,
    ROTATE,
    CallTimes,
    Document,
    Gate,
    Known,
    Loaded,
    Loading,
    PlannedCall,
    Recorded,
    SessionStore,
)
from shared import background
from shared.domain.principal import Principal
from shared.jobs import send_job
from shared.repositories import sessions as sessions_repo
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

AUTO_REFLECT_TASK = "maintenance.auto_reflect"

SESSIONS_OPENED = Counter("mcp_sessions_opened_total", "Logical MCP sessions opened", ["transport"])
SESSIONS_OPEN = Gauge("mcp_sessions_active", "MCP sessions opened minus ended by this gateway", ["transport"])
SEGMENT_ROTATIONS = Counter("mcp_session_segment_rotation_total", "Session segments rotated", ["reason"])
SESSIONS_RESUMED = Counter("mcp_session_resumed_total", "initialize requests that continued a session of the same Bearer")

# A session whose client never opened a GET stream (or has not yet: an SDK client opens it
# right after initialize) counts as live until it has not been used for this long.
QUIET_SECONDS = 30.0
# How long a reconnect waits, at most, for a just-closed GET stream of its key to be counted.
STREAM_CLOSE_CHECKS = 6
STREAM_CLOSE_WAIT_SECONDS = 0.1
# Session rows learn their activity this often; a crash loses at most this much of it.
ACTIVITY_FLUSH_SECONDS = 1.0
ACTIVITY_KEPT = 100
# Keys outlive the idle timeout by this much, so the sweep still finds what it ends.
KEY_GRACE_SECONDS = 120.0
# Sessions a replica remembers as it last resolved them (Sessions._known).
KNOWN_SESSIONS = 10_000


@dataclass
class Resolving:
    """A resolve() queued in a round trip, with the tool call it records ahead, if any, and
    what this replica knew of the session when it was queued; resolved() fills `loaded`."""

    client_id: str | None
    loading: Loading | None
    call: PlannedCall | None = None
    known: tuple[Known, ActiveSession] | None = None
    loaded: Loaded | None = None


@dataclass
class CallAhead:
    """A tool call recorded in the round trip that resolved its session, before the checks
    that may still refuse it. The MCP handler takes it (current_segment) once they pass;
    one nobody took is taken back (take_back)."""

    tool: str
    gate: Gate | None
    handle: str
    planned: PlannedCall
    recorded: Recorded
    taken: bool = False


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


class Sessions:
    """The one owner of MCP session identity."""

    def __init__(self, settings: GatewaySettings, store: SessionStore, pool: asyncpg.Pool, celery: Celery | None) -> None:
        self.settings = settings
        self.store = store
        self.pool = pool
        self.celery = celery
        self.idle_timeout = settings.session_idle_timeout.total_seconds()
        self.ttl = self.idle_timeout + KEY_GRACE_SECONDS
        # Activity entries not yet written to their segment's row, by segment.
        self._pending: dict[str, list[dict[str, Any]]] = {}
        # Legacy SSE sessions whose stream this replica holds (/health reports them).
        self.held_sse: set[str] = set()
        # Sessions this replica resolved, by client id, as of their revision (queue_resolve).
        # The store checks every request against it, so an entry is never served stale; the
        # bound only limits memory.
        self._known: LRUCache[str, tuple[Known, ActiveSession]] = LRUCache(KNOWN_SESSIONS)

    @property
    def segmented(self) -> bool:
        return self.settings.session_segment

    # -- open --------------------------------------------------------------------------
    async def open(
        self, transport: Transport, principal: Principal, token: str | None, mode: str | None,
        *, mode_given: bool = False, client_id: str | None = None, owner: str | None = None,
    ) -> ActiveSession:
        """A new client connection: it continues the Bearer's idle session when there is one
        (Streamable HTTP), else it opens a new logical session named after its id."""
        client_id = client_id or uuid.uuid4().hex
        digest = token_digest(token) if token else None
        resumed = await self._resumable(digest) if transport == "streamable-http" and digest else None
        if resumed is not None:
            SESSIONS_RESUMED.inc()
            previous = list(resumed["clients"])
            ids = [i for i, t in resumed["ids"].items() if t in previous]

            def attach(doc: Document) -> Document:
                doc["ids"] = {i: t for i, t in doc["ids"].items() if t not in previous}
                doc["clients"] = {}
                return self._attached(doc, client_id, mode if mode_given else doc["mode"])

            _, doc = await self.store.update(doc_key(resumed["handle"]), attach, self.ttl)
            if doc is not None:
                # The client that left is gone: its ids end without ending the session.
                await self.store.delete(*[id_key(i) for i in ids])
                logger.info("client %s continues session %s", client_id, doc["session_id"])
        if resumed is None or doc is None:
            doc = self._attached(
                {
                    "handle": client_id, "session_id": client_id, "transport": transport,
                    "key_id": principal.key_id, "workspace": principal.default_workspace,
                    "token_digest": digest, "mode": mode, "seq": 1, "segment_started": time.time(),
                    "last_activity": time.time(), "started_at": _now_iso(), "segment_calls": 0,
                    "ids": {}, "clients": {}, "streams": 0, "v": 0,
                    # Legacy SSE: the replica that holds the stream (its internal URL).
                    "owner": owner,
                },
                client_id, mode,
            )
            await self.store.put(doc_key(client_id), doc, self.ttl)
            SESSIONS_OPENED.labels(transport).inc()
            SESSIONS_OPEN.labels(transport).inc()
            async with self.pool.acquire() as conn:
                await self._start_row(conn, doc)
        await self.store.put(id_key(client_id), {"h": doc["handle"], "t": client_id}, self.ttl)
        if digest:
            await self._remember_token(digest, doc["handle"], transport, client_id)
        await self.store.touch(doc["handle"], [], self.ttl)
        return ActiveSession(client_id, client_id, False, doc)

    @staticmethod
    def _attached(doc: Document, client_id: str, mode: str | None) -> Document:
        doc["ids"][client_id] = client_id
        doc["clients"][client_id] = client_id
        doc["mode"] = mode
        doc["streams"] = 0
        doc["stream_closed"] = False
        doc["attached_at"] = time.time()
        return doc

    async def _remember_token(self, digest: str, handle: str, transport: Transport, client_id: str) -> None:
        key = token_key(digest)
        entry = await self.store.get(key) or {"handles": [], "latest": {}}
        if handle not in entry["handles"]:
            entry["handles"] = [*entry["handles"][-19:], handle]  # a key's recent sessions
        entry["latest"][transport] = client_id
        await self.store.put(key, entry, self.ttl)

    async def _resumable(self, digest: str) -> Document | None:
        entry = await self.store.get(token_key(digest))
        if entry is None:
            return None
        for _ in range(STREAM_CLOSE_CHECKS):
            docs = [d for d in await self.store.get_many([doc_key(h) for h in entry["handles"]]) if d is not None]
            now = time.time()
            candidates = []
            for doc in docs:
                if doc["transport"] != "streamable-http" or doc.get("streams", 0) > 0:
                    continue
                used = await self.store.last_used(doc["handle"]) or doc["attached_at"]
                if doc.get("stream_closed") or now - used > QUIET_SECONDS:
                    candidates.append((used, doc))
            if candidates:
                return max(candidates, key=lambda c: c[0])[1]
            if not any(d["transport"] == "streamable-http" and d.get("streams", 0) > 0 for d in docs):
                return None
            # A client that reconnects right after closing its GET stream can be here before
            # the replica serving that stream has seen it close.
            await asyncio.sleep(STREAM_CLOSE_WAIT_SECONDS)
        return None

    # -- resolve -----------------------------------------------------------------------
    async def resolve(self, client_id: str | None, *, touch: bool = True) -> ActiveSession | None:
        """The live session a client id names, or None (unknown, ended, or taken over)."""
        if not client_id:
            return None
        return self._active(client_id, await self.store.load(id_key(client_id), doc_key(""), self.ttl, touch=touch))

    def queue_resolve(
        self, trip: RoundTrip, client_id: str | None, tool: str | None = None, gate: Gate | None = None
    ) -> Resolving:
        """resolve() within a request's round trip (core/round_trip.py), in one command;
        resolved() reads it. `tool`: a tools/call the request carries, recorded in the same
        command (called_ahead()). A session this replica resolved before is sent back only
        when it changed since (its revision or its id record): the store answers with what
        this replica knows of it, so a tool call of a known session moves and decodes no
        document here (bench/README.md, "The gateway's cost per call after the rebuild")."""
        if not client_id:
            return Resolving(None, None)
        known = self._known.get(client_id)
        planned = None
        if tool is not None:
            entry = json.dumps({"tool": tool, "at": _now_iso()})
            planned = PlannedCall(
                id_key(client_id), client_id, doc_key(""), activity_key(""), entry, ACTIVITY_KEPT, self.ttl, self._call_times(), gate
            )
        loading = Loading(id_key(client_id), client_id, doc_key(""), self.ttl, planned, known[0] if known else None)
        return Resolving(client_id, self.store.queue_load(trip, loading), planned, known)

    async def resolved(self, resolving: Resolving) -> ActiveSession | None:
        client_id = resolving.client_id
        if client_id is None or resolving.loading is None:
            return None
        loaded = resolving.loaded = await self.store.loaded(resolving.loading)
        if loaded is None:
            self._known.pop(client_id, None)
            return None
        if loaded.found is None:  # unchanged since this replica read it
            return resolving.known[1] if resolving.known is not None else None
        session = self._active(client_id, loaded.found)
        if session is not None and loaded.known is not None:
            self._known[client_id] = (loaded.known, session)
        return session

    async def called_ahead(self, resolving: Resolving, session: ActiveSession | None, tool: str) -> CallAhead | None:
        """The tool call recorded in the resolving round trip, if it was."""
        loaded, planned = resolving.loaded, resolving.call
        if planned is None or session is None or loaded is None:
            return None
        if loaded.outcome == RECORDED:
            recorded = Recorded("recorded", {"session_id": session.session_id, "seq": session.doc["seq"]}, loaded.count)
        elif loaded.outcome == ROTATE and loaded.found is not None:
            recorded = Recorded("rotate", dict(loaded.found[1]), loaded.count)
        elif loaded.outcome == REFUSED and loaded.count is not None:
            recorded = Recorded("refused", count=loaded.count)
        else:  # not recorded ahead (a store without Redis): the handler records it
            return None
        return CallAhead(tool, planned.gate, session.handle, planned, recorded)

    async def take_back(self, ahead: CallAhead) -> None:
        """A call recorded ahead that its checks refused: it did not happen."""
        await self.store.unrecord(ahead.planned, ahead.handle, ahead.recorded)

    def _call_times(self) -> CallTimes:
        now = time.time()
        if not self.segmented:
            return CallTimes(now, 0.0, 0.0)
        return CallTimes(now, now - self.settings.segment_idle.total_seconds(), now - self.settings.segment_lifetime.total_seconds())

    @staticmethod
    def _active(client_id: str, found: tuple[Document, Document] | None) -> ActiveSession | None:
        if found is None:
            return None
        record, doc = found
        if client_id not in doc["ids"]:
            return None
        return ActiveSession(client_id, doc["ids"][client_id], bool(record.get("retired")), doc)

    async def for_token(self, token: str | None, transport: Transport) -> str | None:
        """The client id a request of this Bearer without a session id belongs to."""
        if not token:
            return None
        entry = await self.store.get(token_key(token_digest(token)))
        client_id = entry["latest"].get(transport) if entry is not None else None
        return client_id if isinstance(client_id, str) and await self.resolve(client_id, touch=False) else None

    async def set_mode(self, session: ActiveSession, mode: str | None) -> None:
        def change(doc: Document) -> Document:
            doc["mode"] = mode
            return doc

        await self.store.update(doc_key(session.handle), change, self.ttl)

    # -- segments ----------------------------------------------------------------------
    async def current_segment(
        self, session: ActiveSession, tool: str, gate: Gate | None = None, ahead: CallAhead | None = None
    ) -> tuple[str | None, int | None]:
        """Record a tool call of the session: (the segment id it belongs to, the gate's count).
        The segment rotates first when it went idle or outlived its lifetime. `gate`: a
        counter the call is counted on first, in the same round trip; past its limit the call
        is not recorded and the segment is None. The count is None when the store could not
        count it (without Redis): the caller counts it. `ahead`: the call as the front door
        recorded it already (used when it is this call, with this gate).

        A call is recorded in one round trip that changes the document in the store only if
        its segment stays (store.record); a rotation is a versioned swap, so of two replicas
        serving calls of one session at once only one rotates a segment; the other reads
        again and goes on."""
        if ahead is not None and not ahead.taken and ahead.tool == tool and ahead.gate == gate:
            ahead.taken = True
            entry = json.loads(ahead.planned.entry)
            recorded = ahead.recorded
        else:
            entry = {"tool": tool, "at": _now_iso()}
            recorded = await self.store.record(
                doc_key(session.handle), activity_key(session.handle), entry, ACTIVITY_KEPT, self.ttl, self._call_times(), gate
            )
        if recorded.outcome == "refused":
            return None, recorded.count
        if recorded.outcome == "gone" or recorded.doc is None:
            raise SessionGone(session.client_id)
        after = recorded.doc if recorded.outcome == "recorded" else await self._rotated(session, recorded.doc, entry)
        segment = segment_of(after, self.segmented)
        self._pending.setdefault(segment, []).append(entry)
        return segment, recorded.count

    async def _rotated(self, session: ActiveSession, current: Document, entry: dict[str, Any]) -> Document:
        """Record a call whose segment went idle or outlived its lifetime: a new segment."""
        idle = self.settings.segment_idle.total_seconds()
        lifetime = self.settings.segment_lifetime.total_seconds()
        before: Document | None = current
        while True:
            if before is None:
                raise SessionGone(session.client_id)
            after = dict(before)
            now = time.time()
            reason = None
            if self.segmented:
                if now - before["last_activity"] > idle:
                    reason = "segment_idle"
                elif now - before["segment_started"] > lifetime:
                    reason = "segment_lifetime"
            if reason is not None:
                after.update(seq=before["seq"] + 1, segment_started=now, segment_calls=0)
            after["last_activity"] = now
            after["segment_calls"] = after["segment_calls"] + 1
            swapped, current_doc = await self.store.swap(
                doc_key(session.handle), int(before.get("v", 0)), after, self.ttl,
                activity_key(session.handle), entry, ACTIVITY_KEPT,
            )
            if swapped:
                break
            before = current_doc
        if reason is not None:
            SEGMENT_ROTATIONS.labels(reason).inc()
            await self._hand_over(after, segment_of(before, True), reason, before["segment_calls"])
        return after

    async def activity(self, session: ActiveSession) -> list[dict[str, Any]]:
        """The session's last ACTIVITY_KEPT tool calls, oldest first."""
        return await self.store.log(activity_key(session.handle))

    async def _start_row(self, conn: asyncpg.Connection, doc: Document, previous_id: str | None = None) -> None:
        await sessions_repo.start(
            conn, session_id=segment_of(doc, self.segmented), transport_id=doc["session_id"],
            key_id=doc["key_id"], workspace=doc["workspace"], mode=doc["mode"], seq=doc["seq"], previous_id=previous_id,
        )

    async def _hand_over(self, doc: Document, old_segment: str, reason: str, calls: int) -> None:
        """End the old segment's row and start the session's new one in one transaction;
        the ended segment goes to reflect if it saw a tool call."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._flush_segment(conn, old_segment)
            ended = await sessions_repo.end(conn, old_segment, reason)
            await self._start_row(conn, doc, previous_id=old_segment)
        if ended and calls:
            await self._reflect(old_segment, doc["key_id"], reason)

    # -- rotate ------------------------------------------------------------------------
    async def rotate(self, session: ActiveSession, reason: str) -> str:
        """Give the session a new id; its state stays. The old segment ends and is reflected.
        The ids it had keep reaching it, but only with its credential (seed: the new id
        replaces the one that may have leaked; the client's connection is not disturbed)."""
        new_id = uuid.uuid4().hex
        transport_id = session.transport_id

        def change(doc: Document) -> Document:
            doc["session_id"] = new_id
            doc["seq"] = 1
            doc["segment_started"] = time.time()
            doc["segment_calls"] = 0
            doc["ids"][new_id] = transport_id
            doc["clients"][transport_id] = new_id
            return doc

        before, after = await self.store.update(doc_key(session.handle), change, self.ttl)
        if before is None or after is None:
            raise SessionGone(session.client_id)
        for client_id in before["ids"]:
            await self.store.put(id_key(client_id), {"h": session.handle, "t": before["ids"][client_id], "retired": True}, self.ttl)
        await self.store.put(id_key(new_id), {"h": session.handle, "t": transport_id}, self.ttl)
        if after.get("token_digest"):
            await self._remember_token(after["token_digest"], session.handle, session.transport, new_id)
        await self._hand_over(after, segment_of(before, self.segmented), reason, before["segment_calls"])
        return new_id

    # -- streams -------------------------------------------------------------------------
    async def stream_opened(self, session: ActiveSession) -> None:
        def change(doc: Document) -> Document:
            doc["streams"] = doc.get("streams", 0) + 1
            return doc

        await self.store.update(doc_key(session.handle), change, self.ttl)

    async def stream_closed(self, session: ActiveSession) -> None:
        def change(doc: Document) -> Document:
            doc["streams"] = max(0, doc.get("streams", 0) - 1)
            doc["stream_closed"] = True
            return doc

        await self.store.update(doc_key(session.handle), change, self.ttl)

    # -- the end -----------------------------------------------------------------------
    async def detach(self, session: ActiveSession, reason: str) -> None:
        """One client connection ended (DELETE, its SSE stream closed); the logical session
        ends with its last one."""
        transport_id = session.transport_id

        def change(doc: Document) -> Document | None:
            doc["ids"] = {i: t for i, t in doc["ids"].items() if t != transport_id}
            doc["clients"].pop(transport_id, None)
            return doc if doc["clients"] else None

        before, after = await self.store.update(doc_key(session.handle), change, self.ttl)
        if before is None:
            return
        await self.store.delete(*[id_key(i) for i, t in before["ids"].items() if t == transport_id])
        if after is None:
            await self._ended(before, reason)

    async def end(self, session: ActiveSession, reason: str) -> None:
        """End the logical session and every client id of it (its key was set inactive or
        deleted): its ids answer as unknown from now on, on every replica."""
        before, _ = await self.store.update(doc_key(session.handle), lambda doc: None, self.ttl)
        if before is None:
            return
        await self.store.delete(*[id_key(i) for i in before["ids"]])
        await self._ended(before, reason)

    async def _ended(self, doc: Document, reason: str) -> None:
        SESSIONS_OPEN.labels(doc["transport"]).dec()
        await self.store.delete(activity_key(doc["handle"]))
        await self.store.forget_use(doc["handle"])
        segment = segment_of(doc, self.segmented)
        async with self.pool.acquire() as conn:
            await self._flush_segment(conn, segment)
            ended = await sessions_repo.end(conn, segment, reason)
        if ended and doc["segment_calls"]:
            await self._reflect(segment, doc["key_id"], reason)

    async def _reflect(self, segment_id: str, key_id: str | None, reason: str) -> None:
        """Ask maintenance to reflect an ended segment; its row is committed by now."""
        kwargs = {"session_id": segment_id, "key_id": key_id, "reason": reason}
        # send_task does blocking broker I/O; keep it off the event loop.
        sent = self.celery is not None and await asyncio.to_thread(send_job, self.celery, AUTO_REFLECT_TASK, kwargs)
        if not sent:
            # The row stays ended and unreflected; maintenance's sweep of such rows picks it up.
            logger.info("auto reflect of %s not enqueued (no broker); left for the sweep", segment_id)

    async def sweep_idle(self) -> None:
        """End the sessions nobody used for MEMENTO_SESSION_IDLE_TIMEOUT. Every replica sweeps;
        the store's atomic delete lets exactly one of them end each session."""
        for handle in await self.store.unused_since(time.time() - self.idle_timeout):
            before, _ = await self.store.update(doc_key(handle), lambda doc: None, self.ttl)
            if before is None:
                await self.store.forget_use(handle)
                continue
            await self.store.delete(*[id_key(i) for i in before["ids"]])
            logger.info("session %s idle for %.0f s; ended", before["session_id"], self.idle_timeout)
            await self._ended(before, "session_end")

    # -- activity, written behind the calls ----------------------------------------------
    async def _flush_segment(self, conn: asyncpg.Connection, segment: str) -> None:
        entries = self._pending.pop(segment, None)
        if entries:
            await sessions_repo.record_activity(conn, segment, entries)

    async def flush_all(self) -> None:
        """Write every pending activity entry now (an admin view, shutdown)."""
        if self._pending:
            async with self.pool.acquire() as conn:
                for segment in list(self._pending):
                    await self._flush_segment(conn, segment)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The background work of this replica: activity writes and the idle sweep."""
        task = asyncio.get_running_loop().create_task(self._background())
        try:
            yield
        finally:
            await background.stop(task)
            await self.flush_all()

    async def _background(self) -> None:
        sweep_every = max(ACTIVITY_FLUSH_SECONDS, min(self.idle_timeout / 3, 30.0))
        next_sweep = time.monotonic() + sweep_every
        while True:
            await asyncio.sleep(ACTIVITY_FLUSH_SECONDS)
            try:
                await self.flush_all()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every
                    await self.sweep_idle()
            except (asyncpg.PostgresError, OSError, RedisError):
                logger.warning("session activity or idle sweep not done; retrying", exc_info=True)
