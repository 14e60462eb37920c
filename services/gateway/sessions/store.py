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
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

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
        left missing (`change` is not called). Every change bumps the document's version "v"."""
        ...

    async def load(self, id_key: str, doc_prefix: str, ttl: float, *, touch: bool) -> tuple[Document, Document] | None:
        """The id record at `id_key` and the document it names (`doc_prefix` + its "h"), in one
        round trip; `touch` refreshes both keys and the last-used time."""
        ...

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        """Replace the document if it is still at `version` (its "v"), and append `entry` to
        the log at `log_key` (the newest `keep` kept): (True, None), or (False, the document
        as it is now, None when gone). One round trip: the tool call's hot path."""
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


def _bumped(before: Document, after: Document | None) -> Document | None:
    """Every change moves the version on, so a swap based on an older read fails."""
    if after is not None:
        after["v"] = int(before.get("v", 0)) + 1
    return after


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


class RedisSessionStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._load = redis.register_script(_LOAD)
        self._swap = redis.register_script(_SWAP)

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

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        value["v"] = version + 1
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
            await self.put(key, value, ttl)
            self._logs[log_key] = [*self._logs.get(log_key, [])[-(keep - 1):], json.dumps(entry)]
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

