"""Where logical MCP sessions live: Redis, so any gateway replica serves any request, or this
process when Redis is off (REDIS_ENABLED=false: one replica only).

Both stores keep JSON documents under string keys with a time to live, change one document
atomically (Redis: WATCH/MULTI, retried when another replica wrote it in between; here: one
lock) and keep an index of when each session was last used, which the idle sweep reads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError, WatchError

from services.gateway.core.round_trip import Reply, RoundTrip

Document = dict[str, Any]
Change = Callable[[Document], Document | None]  # the new document, or None to delete it

LAST_USED_INDEX = "gw:sessions:last-used"
# Redis down, hung (a timeout) or refused by the client's breaker (shared/redis_breaker.py).
UNREACHABLE = (RedisError, OSError)


class SessionStore(Protocol):
    async def get(self, key: str) -> Document | None: ...

    async def get_many(self, keys: list[str]) -> list[Document | None]: ...

    async def put(self, key: str, value: Document, ttl: float) -> None: ...

    async def put_new(self, key: str, value: Document, ttl: float) -> bool: ...

    async def delete(self, *keys: str) -> None: ...

    async def update(self, key: str, change: Change, ttl: float) -> tuple[Document | None, Document | None]:
        """Apply `change` to the document atomically; (before, after). A missing document is
        left missing (`change` is not called). Every change bumps the document's version "v"
        and its revision "rev" (Known)."""
        ...

    async def load(self, id_key: str, doc_prefix: str, ttl: float, *, touch: bool) -> tuple[Document, Document] | None:
        """The id record at `id_key` and the document it names (`doc_prefix` + its "h"), in one
        round trip; `touch` refreshes both keys and the last-used time."""
        ...

    def queue_load(self, trip: RoundTrip, loading: Loading) -> Loading:
        """load() (touching) within a request's round trip (core/round_trip.py), with the tool
        call `loading.call` recorded in the same command; loaded() reads it."""
        ...

    async def loaded(self, loading: Loading) -> Loaded | None:
        """What a queued load found (None: unknown, ended, or no longer one of its session's
        ids). A store that records no call ahead leaves Loaded.outcome at NOT_RECORDED (the
        caller records the call with record())."""
        ...

    async def unrecord(self, planned: PlannedCall, handle: str, recorded: Recorded) -> None:
        """Take back a call recorded ahead: its count on the gate, its activity entry."""
        ...

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        """Replace the document if it is still at `version` (its "v"), and append `entry` to
        the log at `log_key` (the newest `keep` kept): (True, None), or (False, the document
        as it is now, None when gone). A swap moves "v" and the revision "rev" on."""
        ...

    async def record(
        self, key: str, log_key: str, entry: Document, keep: int, ttl: float, call: CallTimes, gate: Gate | None = None
    ) -> Recorded:
        """One tool call, in one round trip (the hot path): count it on `gate` first (refused
        past its limit: nothing recorded); then, unless the document's segment has to rotate
        first, set its last_activity to `call.now`, count it in segment_calls and append
        `entry` to the log at `log_key`. A store without the gate's counter leaves it
        uncounted (Recorded.count None)."""
        ...

    async def log(self, log_key: str) -> list[Document]: ...

    async def touch(self, handle: str, keys: list[str], ttl: float) -> None:
        """The session was used now: refresh its keys' time to live and its last-used time."""
        ...

    async def last_used(self, handle: str) -> float | None: ...

    async def unused_since(self, before: float) -> list[str]: ...

    async def forget_use(self, handle: str) -> None: ...

    async def count_used(self) -> int: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class CallTimes:
    """When a call happens, and the bounds past which its segment rotates instead: a document
    whose last_activity is before `idle_before`, or whose segment started before
    `lifetime_before`, is left for the caller's versioned swap (0 turns a bound off)."""

    now: float
    idle_before: float
    lifetime_before: float

    def rotates(self, doc: Document) -> bool:
        return float(doc["last_activity"]) < self.idle_before or float(doc["segment_started"]) < self.lifetime_before


@dataclass(frozen=True)
class Gate:
    """A counter a call is counted on in the round trip that records it, before it is
    recorded; past `limit` it is not recorded (a key's calls today: core/usage.py)."""

    key: str
    limit: int
    ttl: float


@dataclass(frozen=True)
class Recorded:
    """What record() did: "recorded" (`doc` holds the segment's session_id and seq), "rotate"
    (nothing changed; `doc` is the document as it is), "refused" (the gate is past its limit)
    or "gone"; `count`: the gate's count, None when the gate was not counted."""

    outcome: Literal["recorded", "rotate", "refused", "gone"]
    doc: Document | None = None
    count: int | None = None


@dataclass(frozen=True)
class PlannedCall:
    """A tool call to record in the round trip that resolves its session (the front door's),
    ahead of the checks that may still refuse it (then it is taken back: unrecord())."""

    id_key: str
    client_id: str
    doc_prefix: str
    log_prefix: str
    entry: str  # the activity entry, as JSON (unrecord() removes this exact string)
    keep: int
    ttl: float
    times: CallTimes
    gate: Gate | None


@dataclass(frozen=True)
class Known:
    """What a replica last read of a session: its id record as stored, and its document's
    revision "rev". Every change of a document but a call's counters (last_activity,
    segment_calls, "v") moves "rev" on, so a load told what is known answers with the
    document only when it changed since, and the replica reuses what it decoded then."""

    record: bytes
    rev: int


@dataclass(frozen=True)
class Loading:
    """A load of the session a client id names, queued in a round trip, with a tool call to
    record in the same command (`call`) and what the caller knows of it (`known`)."""

    id_key: str
    client_id: str
    doc_prefix: str
    ttl: float
    call: PlannedCall | None = None
    known: Known | None = None
    reply: Reply | None = None


# Loaded.outcome: what the load did with its call.
NOT_RECORDED, GONE, ROTATE, RECORDED, REFUSED = -1, 0, 1, 2, 3


@dataclass(frozen=True)
class Loaded:
    """A queued load's answer: the id record and the document before the call (None when
    they are still as Loading.known said), what to know of them from now on (None: this store
    does not say, so every load reads them in full), and what became of the call it
    recorded (`outcome`, one of the constants above, and the gate's `count`)."""

    found: tuple[Document, Document] | None
    known: Known | None
    outcome: int = NOT_RECORDED
    count: int | None = None


def _bumped(before: Document, after: Document | None) -> Document | None:
    """Every change moves the version on, so a swap based on an older read fails, and the
    revision, so a replica that knows the session reads it again (Known)."""
    if after is not None:
        after["v"] = int(before.get("v", 0)) + 1
        after["rev"] = int(before.get("rev", 0)) + 1
    return after


def _recorded(outcome: Any) -> Recorded:
    if outcome[0] == 2:
        session_id = outcome[1].decode() if isinstance(outcome[1], bytes) else str(outcome[1])
        return Recorded("recorded", {"session_id": session_id, "seq": int(outcome[2])}, _count(outcome[3]))
    if outcome[0] == 1:
        return Recorded("rotate", json.loads(outcome[1]), _count(outcome[2]))
    if outcome[0] == 3:
        return Recorded("refused", count=int(outcome[1]))
    return Recorded("gone")


def _count(value: Any) -> int | None:
    """A gate's count from a Lua reply (-1: no gate)."""
    return int(value) if int(value) >= 0 else None


def _ttl_ms(ttl: float) -> int:
    return max(1, int(ttl * 1000))


_LOAD = """
local record = redis.call('GET', KEYS[1])
if not record then return false end
local handle = cjson.decode(record)['h']
local doc = redis.call('GET', ARGV[1] .. handle)
if not doc then return false end
if ARGV[2] == '1' then
  redis.call('ZADD', ARGV[4], ARGV[5], handle)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', ARGV[1] .. handle, ARGV[3])
end
return {record, doc}
"""

_SWAP = """
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
local version = cjson.decode(current)['v'] or 0
if tonumber(version) ~= tonumber(ARGV[1]) then return {1, current} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {2}
"""

# A tool call changes three fields of the document: in Redis, so that the gateway neither
# decodes nor encodes it per call. cjson writes numbers with 14 significant digits (a time
# keeps 0.1 ms); a document has no arrays (cjson would write an empty one as {}).
# ARGV: now, idle_before, lifetime_before, ttl ms, the log entry, entries kept, the gate's
# limit and ttl ms (see CallTimes and Gate). Replies: {2, session_id, seq, count} recorded,
# {1, document, count} rotate first (nothing recorded), {3, count} refused, {0} gone.
_RECORD_CALL = """
local function record_decoded(doc_key, log_key, gate_key, current, doc)
  local count = -1
  if gate_key then
    count = redis.call('INCR', gate_key)
    redis.call('PEXPIRE', gate_key, ARGV[8])
    if count > tonumber(ARGV[7]) then return {3, count} end
  end
  if tonumber(doc['last_activity']) < tonumber(ARGV[2]) or tonumber(doc['segment_started']) < tonumber(ARGV[3]) then
    return {1, current, count}
  end
  doc['last_activity'] = tonumber(ARGV[1])
  doc['segment_calls'] = (tonumber(doc['segment_calls']) or 0) + 1
  doc['v'] = (tonumber(doc['v']) or 0) + 1
  redis.call('SET', doc_key, cjson.encode(doc), 'PX', ARGV[4])
  redis.call('RPUSH', log_key, ARGV[5])
  redis.call('LTRIM', log_key, -tonumber(ARGV[6]), -1)
  redis.call('PEXPIRE', log_key, ARGV[4])
  return {2, doc['session_id'], doc['seq'], count}
end
"""
_RECORD = _RECORD_CALL + """
local current = redis.call('GET', KEYS[1])
if not current then return {0} end
return record_decoded(KEYS[1], KEYS[2], KEYS[3], current, cjson.decode(current))
"""
# The front door's one command per request of a session (Sessions.queue_resolve): the session
# a client id names, when that id is still one of the session's, touched; with a tool call
# recorded (ARGV[15] '1'). KEYS: the id record, the gate's counter (when counted). ARGV 1-8 as
# for a call; 9 the document prefix, 10 the log prefix, 11 the client id, 12 the last-used
# index, 13 and 14 the revision and the id record the caller knows (Known; -1 and '' for none).
# Replies: {0} gone; {1, outcome, count} when the caller's Known still holds (nothing more to
# send or decode); else {1, outcome, count, rev, id record, document as it was before the call}.
# outcome: -1 no call, else record_decoded's first field.
_RESOLVE = _RECORD_CALL + """
local record = redis.call('GET', KEYS[1])
if not record then return {0} end
local handle = cjson.decode(record)['h']
local doc_key = ARGV[9] .. handle
local current = redis.call('GET', doc_key)
if not current then return {0} end
local doc = cjson.decode(current)
if type(doc['ids']) ~= 'table' or doc['ids'][ARGV[11]] == nil then return {0} end
redis.call('ZADD', ARGV[12], ARGV[1], handle)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', doc_key, ARGV[4])
local rev = tonumber(doc['rev']) or 0
local outcome, count = -1, -1
if ARGV[15] == '1' then
  local done = record_decoded(doc_key, ARGV[10] .. handle, KEYS[2], current, doc)
  outcome = done[1]
  count = done[#done]
end
if outcome ~= 1 and rev == tonumber(ARGV[13]) and record == ARGV[14] then return {1, outcome, count} end
return {1, outcome, count, rev, record, current}
"""
# Takes back a call recorded ahead of its checks, which then refused it.
_UNRECORD = """
if KEYS[3] then redis.call('DECR', KEYS[3]) end
if ARGV[4] == '1' then
  local current = redis.call('GET', KEYS[1])
  if current then
    local doc = cjson.decode(current)
    if doc['session_id'] == ARGV[2] and tonumber(doc['seq']) == tonumber(ARGV[3]) and tonumber(doc['segment_calls']) > 0 then
      doc['segment_calls'] = doc['segment_calls'] - 1
      doc['v'] = (tonumber(doc['v']) or 0) + 1
      redis.call('SET', KEYS[1], cjson.encode(doc), 'KEEPTTL')
    end
  end
  redis.call('LREM', KEYS[2], -1, ARGV[1])
end
return 1
"""


class RedisSessionStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._load = redis.register_script(_LOAD)
        self._swap = redis.register_script(_SWAP)
        self._record = redis.register_script(_RECORD)
        self._resolve = redis.register_script(_RESOLVE)
        self._unrecord = redis.register_script(_UNRECORD)

    async def get(self, key: str) -> Document | None:
        raw = await self.redis.get(key)
        return json.loads(raw) if raw else None

    async def get_many(self, keys: list[str]) -> list[Document | None]:
        if not keys:
            return []
        return [json.loads(raw) if raw else None for raw in await self.redis.mget(keys)]

    async def put(self, key: str, value: Document, ttl: float) -> None:
        await self.redis.set(key, json.dumps(value), px=_ttl_ms(ttl))

    async def put_new(self, key: str, value: Document, ttl: float) -> bool:
        return bool(await self.redis.set(key, json.dumps(value), px=_ttl_ms(ttl), nx=True))

    async def delete(self, *keys: str) -> None:
        if keys:
            await self.redis.delete(*keys)

    async def update(self, key: str, change: Change, ttl: float) -> tuple[Document | None, Document | None]:
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if not raw:
                        await pipe.unwatch()
                        return None, None
                    before = json.loads(raw)
                    after = _bumped(before, change(json.loads(raw)))
                    pipe.multi()
                    if after is None:
                        pipe.delete(key)
                    else:
                        pipe.set(key, json.dumps(after), px=_ttl_ms(ttl))
                    await pipe.execute()
                    return before, after
                except WatchError:  # another replica changed it between our read and write
                    continue

    async def load(self, id_key: str, doc_prefix: str, ttl: float, *, touch: bool) -> tuple[Document, Document] | None:
        found = await self._load(keys=[id_key], args=[doc_prefix, "1" if touch else "0", _ttl_ms(ttl), LAST_USED_INDEX, time.time()])
        if not found:
            return None
        return json.loads(found[0]), json.loads(found[1])

    @staticmethod
    def _resolve_command(loading: Loading) -> tuple[list[Any], list[Any]]:
        """The keys and arguments of _RESOLVE for a load (bytes where the client would encode)."""
        call, known = loading.call, loading.known
        gate = call.gate if call is not None else None
        keys: list[Any] = [loading.id_key] if gate is None else [loading.id_key, gate.key]
        ttl_ms = _ttl_ms(loading.ttl)
        if call is None:
            args: list[Any] = [time.time(), 0, 0, ttl_ms, b"", 0, 0, 0, loading.doc_prefix, b""]
        else:
            times = call.times
            args = [
                times.now, times.idle_before, times.lifetime_before, ttl_ms, call.entry, call.keep,
                gate.limit if gate else 0, _ttl_ms(gate.ttl) if gate else 0, loading.doc_prefix, call.log_prefix,
            ]
        args += [
            loading.client_id, LAST_USED_INDEX, known.rev if known else -1, known.record if known else b"",
            b"0" if call is None else b"1",
        ]
        return keys, args

    def queue_load(self, trip: RoundTrip, loading: Loading) -> Loading:
        keys, args = self._resolve_command(loading)
        reply = trip.queue("EVALSHA", self._resolve.sha, len(keys), *keys, *args)
        return Loading(loading.id_key, loading.client_id, loading.doc_prefix, loading.ttl, loading.call, loading.known, reply)

    async def loaded(self, loading: Loading) -> Loaded | None:
        try:
            if loading.reply is None:
                raise NoScriptError("not queued")
            found = loading.reply.result()
        except NoScriptError:  # a restarted Redis forgot the script; the Script call loads it again
            keys, args = self._resolve_command(loading)
            found = await self._resolve(keys=keys, args=args)
        if not found or int(found[0]) == 0:
            return None
        outcome, count = int(found[1]), _count(found[2])
        if len(found) == 3:  # as the caller knew it
            return Loaded(None, loading.known, outcome, count)
        record = found[4] if isinstance(found[4], bytes) else str(found[4]).encode()
        return Loaded((json.loads(record), json.loads(found[5])), Known(record, int(found[3])), outcome, count)

    async def record(
        self, key: str, log_key: str, entry: Document, keep: int, ttl: float, call: CallTimes, gate: Gate | None = None
    ) -> Recorded:
        keys = [key, log_key] if gate is None else [key, log_key, gate.key]
        args: list[Any] = [call.now, call.idle_before, call.lifetime_before, _ttl_ms(ttl), json.dumps(entry), keep]
        if gate is not None:
            args += [gate.limit, _ttl_ms(gate.ttl)]
        return _recorded(await self._record(keys=keys, args=args))

    async def unrecord(self, planned: PlannedCall, handle: str, recorded: Recorded) -> None:
        done = recorded.outcome == "recorded" and recorded.doc is not None
        keys = [planned.doc_prefix + handle, planned.log_prefix + handle]
        if planned.gate is not None and recorded.count is not None:
            keys.append(planned.gate.key)
        doc = recorded.doc or {}
        args: list[Any] = [planned.entry, str(doc.get("session_id", "")), int(doc.get("seq", 0)), "1" if done else "0"]
        await self._unrecord(keys=keys, args=args)

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        value["v"] = version + 1
        value["rev"] = int(value.get("rev", 0)) + 1  # `value` is the read at `version`, changed
        outcome = await self._swap(keys=[key, log_key], args=[version, json.dumps(value), _ttl_ms(ttl), json.dumps(entry), keep])
        if outcome[0] == 2:
            return True, None
        return False, (json.loads(outcome[1]) if outcome[0] == 1 else None)

    async def log(self, log_key: str) -> list[Document]:
        return [json.loads(raw) for raw in await self.redis.lrange(log_key, 0, -1)]

    async def touch(self, handle: str, keys: list[str], ttl: float) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(LAST_USED_INDEX, {handle: time.time()})
        for key in keys:
            pipe.pexpire(key, _ttl_ms(ttl))
        await pipe.execute()

    async def last_used(self, handle: str) -> float | None:
        score = await self.redis.zscore(LAST_USED_INDEX, handle)
        return float(score) if score is not None else None

    async def unused_since(self, before: float) -> list[str]:
        return [m.decode() if isinstance(m, bytes) else str(m) for m in await self.redis.zrangebyscore(LAST_USED_INDEX, "-inf", before)]

    async def forget_use(self, handle: str) -> None:
        await self.redis.zrem(LAST_USED_INDEX, handle)

    async def count_used(self) -> int:
        return int(await self.redis.zcard(LAST_USED_INDEX))

    async def aclose(self) -> None:
        return None  # the Redis client belongs to the app's lifespan


class MemorySessionStore:
    """The same contract in this process, for a gateway without Redis (one replica). Values
    go through JSON as in Redis, so a caller never shares a document with the store."""

    def __init__(self) -> None:
        self._logs: dict[str, list[str]] = {}
        self._values: dict[str, tuple[str, float]] = {}
        self._used: dict[str, float] = {}
        self._lock = asyncio.Lock()

    def _read(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        if entry[1] < time.monotonic():
            del self._values[key]
            return None
        return entry[0]

    async def get(self, key: str) -> Document | None:
        raw = self._read(key)
        return json.loads(raw) if raw else None

    async def get_many(self, keys: list[str]) -> list[Document | None]:
        return [await self.get(key) for key in keys]

    async def put(self, key: str, value: Document, ttl: float) -> None:
        self._values[key] = (json.dumps(value), time.monotonic() + ttl)

    async def put_new(self, key: str, value: Document, ttl: float) -> bool:
        if self._read(key) is not None:
            return False
        await self.put(key, value, ttl)
        return True

    async def delete(self, *keys: str) -> None:
        for key in keys:
            self._values.pop(key, None)
            self._logs.pop(key, None)

    async def update(self, key: str, change: Change, ttl: float) -> tuple[Document | None, Document | None]:
        async with self._lock:
            raw = self._read(key)
            if raw is None:
                return None, None
            after = _bumped(json.loads(raw), change(json.loads(raw)))
            if after is None:
                self._values.pop(key, None)
            else:
                await self.put(key, after, ttl)
            return json.loads(raw), after

    async def load(self, id_key: str, doc_prefix: str, ttl: float, *, touch: bool) -> tuple[Document, Document] | None:
        record = await self.get(id_key)
        if record is None:
            return None
        doc = await self.get(doc_prefix + record["h"])
        if doc is None:
            return None
        if touch:
            await self.touch(record["h"], [id_key, doc_prefix + record["h"]], ttl)
        return record, doc

    def queue_load(self, trip: RoundTrip, loading: Loading) -> Loading:
        return loading

    async def loaded(self, loading: Loading) -> Loaded | None:
        found = await self.load(loading.id_key, loading.doc_prefix, loading.ttl, touch=True)
        return Loaded(found, None) if found is not None else None  # no call recorded ahead: the handler records it

    async def record(
        self, key: str, log_key: str, entry: Document, keep: int, ttl: float, call: CallTimes, gate: Gate | None = None
    ) -> Recorded:
        # No gate's counter here (without Redis, core/usage.py counts in Postgres): uncounted.
        async with self._lock:
            doc = await self.get(key)
            if doc is None:
                return Recorded("gone")
            if call.rotates(doc):
                return Recorded("rotate", doc)
            doc["last_activity"] = call.now
            doc["segment_calls"] = doc.get("segment_calls", 0) + 1
            doc["v"] = int(doc.get("v", 0)) + 1
            await self.put(key, doc, ttl)
            self._append(log_key, entry, keep)
            return Recorded("recorded", doc)

    async def unrecord(self, planned: PlannedCall, handle: str, recorded: Recorded) -> None:
        return None

    def _append(self, log_key: str, entry: Document, keep: int) -> None:
        self._logs[log_key] = [*self._logs.get(log_key, [])[-(keep - 1):], json.dumps(entry)]

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        async with self._lock:
            current = await self.get(key)
            if current is None:
                return False, None
            if current.get("v", 0) != version:
                return False, current
            value["v"] = version + 1
            value["rev"] = int(current.get("rev", 0)) + 1
            await self.put(key, value, ttl)
            self._append(log_key, entry, keep)
            return True, None

    async def log(self, log_key: str) -> list[Document]:
        return [json.loads(raw) for raw in self._logs.get(log_key, [])]

    async def touch(self, handle: str, keys: list[str], ttl: float) -> None:
        self._used[handle] = time.time()
        for key in keys:
            entry = self._values.get(key)
            if entry is not None:
                self._values[key] = (entry[0], time.monotonic() + ttl)

    async def last_used(self, handle: str) -> float | None:
        return self._used.get(handle)

    async def unused_since(self, before: float) -> list[str]:
        return [handle for handle, at in self._used.items() if at <= before]

    async def forget_use(self, handle: str) -> None:
        self._used.pop(handle, None)

    async def count_used(self) -> int:
        return len(self._used)

    async def aclose(self) -> None:
        return None

