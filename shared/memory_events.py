"""memory:* events (reference 001): what changed in whose memory, in one bounded log that every
gateway replica reads.

Every write path records its events in the write's own transaction: triggers on fragments and
namespaces (migration 0017) write one row of the memory event outbox per namespace and event
type a transaction touched, so an event exists exactly when its write committed and no write
path (MCP, the REST API, imports, consolidation, fsck) can forget one. A writer's pool turns
recording on (`recording_settings`). Postgres wakes the relays at commit (NOTIFY); a
relay in each ingest process appends the rows to one Redis stream (XADD, MAXLEN ~ bounded by
count, XTRIM MINID ~ by age) and deletes them. A Redis outage therefore neither fails nor
slows a write: the rows wait in Postgres and the relay backs off, and subscribers get the
events late rather than never. Delivery is at least once (a relay that dies between XADD and
its commit publishes the row again), in the stream's order.

One stream for every tenant, the tenant in each entry: a master subscriber reads one
stream, ids are one sequence (what `Last-Event-ID` / `since` resume from), and the gateway
filters per subscriber (`visible`). The bound is shared, so a busy tenant can push a quiet
one's old events out; a resumption past what the log still holds is reported as
`stream:gap`, never as a silent hole.

Stream ids are Redis's (`<ms>-<seq>`). Where the log lost entries after a subscriber's
position, Redis 7 says so exactly (XINFO STREAM max-deleted-entry-id); Redis 6.2 reports
only the oldest entry kept: once the log has been trimmed (its oldest entry is no longer
the first ever appended), a position older than the oldest kept counts as a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from shared import background
from shared.domain.principal import TenantScope
from shared.repositories import memory_event_outbox as outbox_repo
from shared.repositories.memory_event_outbox import OutboxEvent
from shared.settings import CommonSettings

logger = logging.getLogger(__name__)

# reference 001: the two memory:* events, both carrying the namespace (camelCase namespaceId).
NAMESPACES_CHANGED = "memory:namespaces-changed"
ENTRIES_CHANGED = "memory:entries-changed"
EVENT_TYPES = (NAMESPACES_CHANGED, ENTRIES_CHANGED)
# reference 001: a truncated resumption is announced as stream:gap, a consumer that fell
# behind as stream:lagged.
STREAM_GAP = "stream:gap"
STREAM_LAGGED = "stream:lagged"

EVENTS_PUBLISHED = Counter("engram_memory_events_published_total", "memory:* events appended to the Redis stream")
OUTBOX_DEPTH = Gauge("engram_memory_event_outbox_depth", "memory:* events recorded and not yet in the Redis stream")

# Rows per relay claim: a 10,000-entry import records one row per namespace, so a claim
# rarely holds more than a few; 200 bounds what a Redis that dies mid-append holds locked.
RELAY_BATCH = 200
FIRST_BACKOFF_S = 0.5
MAX_SEQ = 2**64 - 1


SINK_SETTING = "engram.memory_events_sink"


def sink_of(settings: CommonSettings) -> str:
    """How outbox rows name the stream they are for: a hash (no password is stored). Every
    process of one deployment has the same REDIS_URL and stream key, so the same sink."""
    return hashlib.sha256(f"{settings.redis_url}\n{settings.memory_events_stream}".encode()).hexdigest()[:16]


def recording_settings(settings: CommonSettings) -> dict[str, str]:
    """Connection settings of a writer's pool: with them the triggers of migration 0017
    record every memory change made on its connections. A startup parameter, not a SET, so
    the pool's RESET ALL on release keeps it. Without Redis: none (nothing would relay)."""
    return {SINK_SETTING: sink_of(settings)} if settings.redis_active else {}


def visible(scope: TenantScope, key_id: str | None) -> bool:
    """Whether a subscriber reading `scope` may see an event of tenant `key_id`: in Python
    exactly what shared.domain.principal.scope_clause writes in SQL (everyone, or one of the
    key ids, None being the master key's own)."""
    return scope.everyone or key_id in scope.key_ids


@dataclass(frozen=True, order=True)
class StreamId:
    """A Redis stream entry id, ordered as Redis orders them."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> StreamId:
        """`<ms>-<seq>` (an event id), or `<ms>` alone: the position just before that
        millisecond, so everything from it on follows. ValueError otherwise."""
        ms_text, dash, seq_text = text.strip().partition("-")
        if not ms_text.isdigit() or (dash and not seq_text.isdigit()) or len(ms_text) > 20 or len(seq_text) > 20:
            raise ValueError(f"not an event id: {text!r}")
        ms, seq = int(ms_text), int(seq_text) if dash else 0
        if ms > MAX_SEQ or seq > MAX_SEQ:
            raise ValueError(f"not an event id: {text!r}")
        parsed = cls(ms, seq)
        return parsed if dash else parsed.before()

    def before(self) -> StreamId:
        """The greatest id below this one (a cursor from which this id is the next)."""
        if self.seq:
            return StreamId(self.ms, self.seq - 1)
        return StreamId(self.ms - 1, MAX_SEQ) if self.ms else self

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ZERO = StreamId(0, 0)


@dataclass(frozen=True)
class LoggedEvent:
    id: StreamId
    type: str
    key_id: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class LogBounds:
    first: StreamId | None  # the oldest entry the log still holds (None: it holds none)
    last: StreamId  # the newest id ever added (ZERO: never written)
    max_deleted: StreamId | None  # Redis 7+: the newest id trimmed away; None on 6.2
    origin: StreamId | None = None  # the first id ever appended (recorded by the relays)

    def lost_after(self, cursor: StreamId) -> bool:
        """Whether entries newer than `cursor` were trimmed away (or `cursor` is not from
        this log: newer than anything it ever held)."""
        if cursor > self.last:
            return True
        if self.max_deleted is not None:
            return self.max_deleted > cursor
        if self.first is not None and self.first == self.origin:  # Redis 6.2, never trimmed
            return False
        if self.first is None:  # emptied by trimming: anything added after cursor is gone
            return self.last > cursor
        return cursor < self.first.before()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(raw_id: Any, fields: dict[Any, Any]) -> LoggedEvent:
    values = {_text(k): _text(v) for k, v in fields.items()}
    return LoggedEvent(
        id=StreamId.parse(_text(raw_id)), type=values.get("type", ""), key_id=values.get("key"),
        data=json.loads(values.get("data") or "{}"),
    )


class EventLog:
    """The Redis stream of memory:* events: appended by the relays, read by the gateways."""

    def __init__(self, redis: Redis, settings: CommonSettings) -> None:
        self._redis = redis
        self.stream = settings.memory_events_stream
        self._maxlen = settings.memory_events_maxlen
        self._retention_ms = int(settings.memory_events_retention.total_seconds() * 1000)
        # Redis 6.2 has no max-deleted-entry-id; the first id ever appended, kept beside the
        # stream, tells "never trimmed" from "trimmed" there (a gap only after a trim).
        self._origin_key = f"{self.stream}:origin"
        self._origin_set = False

    async def append(self, events: list[OutboxEvent]) -> None:
        """One round trip: every event (a missing key id is the master key's own), then the
        age bound."""
        pipe = self._redis.pipeline(transaction=False)
        for event in events:
            fields: dict[str, str] = {"type": event.type, "data": json.dumps(event.payload, separators=(",", ":"))}
            if event.key_id is not None:
                fields["key"] = event.key_id
            pipe.xadd(self.stream, fields, maxlen=self._maxlen, approximate=True)  # type: ignore[arg-type]
        oldest_kept = int(time.time() * 1000) - self._retention_ms
        pipe.xtrim(self.stream, minid=f"{max(oldest_kept, 0)}-0", approximate=True)
        added = await pipe.execute()
        if events and not self._origin_set:  # once per process: later appends are never first
            await self._redis.set(self._origin_key, _text(added[0]), nx=True)
            self._origin_set = True

    async def bounds(self) -> LogBounds:
        pipe = self._redis.pipeline(transaction=False)
        pipe.xinfo_stream(self.stream)
        pipe.get(self._origin_key)
        info, origin = await pipe.execute(raise_on_error=False)
        if isinstance(info, ResponseError):  # no such key: nothing was ever appended (or Redis was emptied)
            return LogBounds(None, ZERO, None)
        if isinstance(info, Exception):
            raise info
        info = {_text(k): v for k, v in info.items()}
        first = info.get("first-entry")
        deleted = info.get("max-deleted-entry-id")
        return LogBounds(
            first=StreamId.parse(_text(first[0])) if first else None,
            last=StreamId.parse(_text(info["last-generated-id"])),
            max_deleted=StreamId.parse(_text(deleted)) if deleted is not None else None,
            origin=StreamId.parse(_text(origin)) if origin is not None and not isinstance(origin, Exception) else None,
        )

    async def after(self, cursor: StreamId, count: int) -> list[LoggedEvent]:
        """Up to `count` entries newer than `cursor`, oldest first."""
        # redis-py's stub types these replies as unions of every RESP shape; RESP2's is this.
        rows: Any = await self._redis.xrange(self.stream, min=f"({cursor}", max="+", count=count)
        return [_entry(raw_id, fields) for raw_id, fields in rows]

    async def wait(self, cursor: StreamId, count: int, block_ms: int) -> list[LoggedEvent]:
        """Entries newer than `cursor`, waiting up to `block_ms` for the first (XREAD BLOCK:
        only on a client whose socket timeout outlasts it)."""
        reply: Any = await self._redis.xread(
            {self.stream: str(cursor)}, count=count, block=block_ms
        )
        return [_entry(raw_id, fields) for _, rows in reply or [] for raw_id, fields in rows]


class MemoryEventRelay:
    """Moves recorded events from the outbox to the stream. One per ingest process; any number
    drain one table, one at a time per sink (an advisory lock in `claim`), so the stream keeps
    the outbox's order. Woken by Postgres at the commit of every recording write (LISTEN), and
    every `poll` seconds for rows a relay that died left behind; while Redis refuses, tries again after 0.5 s, 1 s, 2 s ... up to
    `backoff_max`, the rows waiting in Postgres."""

    def __init__(
        self, pool: asyncpg.Pool, log: EventLog, settings: CommonSettings, *, poll: float, backoff_max: float
    ) -> None:
        self._pool = pool
        self._log = log
        self._dsn = settings.database_url
        self.sink = sink_of(settings)
        self._poll = poll
        self._backoff_max = backoff_max
        self._wake = asyncio.Event()
        self.failures = 0  # consecutive appends Redis refused

    async def drain_once(self) -> int:
        """Claim a batch, append it to the stream, delete it; the rows published."""
        async with self._pool.acquire() as conn, conn.transaction():
            events = await outbox_repo.claim(conn, self.sink, RELAY_BATCH)
            if not events:
                return 0
            await self._log.append(events)
            await outbox_repo.delete(conn, [e.id for e in events])
        EVENTS_PUBLISHED.inc(len(events))
        return len(events)

    async def run(self) -> None:
        listening = asyncio.create_task(self._listen())
        try:
            await self._relay()
        finally:
            await background.stop(listening)

    async def _relay(self) -> None:
        while True:
            self._wake.clear()  # before the claim: a commit after it wakes the next round
            published = 0
            try:
                published = await self.drain_once()
            except (RedisError, OSError):
                self.failures += 1
                delay = min(self._backoff_max, FIRST_BACKOFF_S * 2 ** (self.failures - 1))
                logger.warning("memory events: Redis unavailable; the outbox keeps them, next try in %.1f s", delay)
                await self._measure_depth()
                await asyncio.sleep(delay)
                continue
            except (asyncpg.PostgresError, asyncpg.InterfaceError):
                logger.warning("memory events: the database is unavailable; retrying", exc_info=True)
                await asyncio.sleep(self._poll)
                continue
            except Exception:  # the relay task's top level: a bug must not end relaying for the process's life
                logger.exception("memory event relay failed; retrying")
                await asyncio.sleep(self._poll)
                continue
            if self.failures:
                logger.info("memory events: Redis takes events again")
                self.failures = 0
            if published == RELAY_BATCH:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._poll)

    async def _listen(self) -> None:
        """A connection of its own LISTENs (a pooled one would be returned and reused)."""
        while True:
            try:
                conn = await asyncpg.connect(self._dsn, timeout=5)
            except (OSError, asyncpg.PostgresError, TimeoutError):
                await asyncio.sleep(self._poll)
                continue
            closed = asyncio.Event()
            try:
                conn.add_termination_listener(lambda _conn, ended=closed: ended.set())
                await conn.add_listener(outbox_repo.CHANNEL, self._notified)
                self._wake.set()  # rows committed while nobody listened
                await closed.wait()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                logger.warning("memory events: LISTEN connection lost; reconnecting", exc_info=True)
            finally:
                if not conn.is_closed():
                    await conn.close(timeout=2)
            await asyncio.sleep(self._poll)

    def _notified(self, _conn: Any, _pid: int, _channel: str, sink: str) -> None:
        if sink == self.sink:
            self._wake.set()

    async def _measure_depth(self) -> None:
        try:
            async with self._pool.acquire() as conn:
                OUTBOX_DEPTH.set(await outbox_repo.depth(conn, self.sink))
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            logger.warning("memory events: could not measure the outbox", exc_info=True)
