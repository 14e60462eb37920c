"""Redis commands of several owners sent together: one network round trip for what a request
reads and counts (the key generation, the rate-limit counter, the session), instead of one
each. Every owner queues its own commands and reads its own replies once the trip has run.

Measured with bench/gateway_bench.py: five round trips per tool call cost the gateway 25% of
its CPU per call in a py-spy profile (bench/README.md); each one is a send, a wake-up and a
parse. A pipeline (not MULTI) is enough: every owner's commands are atomic on their own
(INCR, a Lua script) and no owner reads another's.

Without Redis, or when the trip fails (Redis down, hung past the client's timeout, or the
client's breaker open: shared/redis_breaker.py), every reply raises that error, and each
owner falls back as it does when its own single command fails.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

# What a request-path Redis call fails with (the breaker refuses with a RedisError too).
UNREACHABLE = (RedisError, OSError)


class RedisUnavailable(RedisError):
    """No Redis to send to (REDIS_ENABLED=false)."""


class Reply:
    """One queued command's reply, readable after the trip has run."""

    def __init__(self, trip: RoundTrip, index: int) -> None:
        self._trip = trip
        self._index = index

    def result(self) -> Any:
        """The command's reply; raises what the command or the whole trip failed with."""
        return self._trip.reply(self._index)


class RoundTrip:
    def __init__(self, redis: aioredis.Redis | None) -> None:
        self._pipe = redis.pipeline(transaction=False) if redis is not None else None
        self._size = 0
        self._replies: list[Any] = []
        self._error: BaseException | None = None if redis is not None else RedisUnavailable("Redis is off")
        self._ran = False

    def queue(self, *command: Any) -> Reply:
        if self._ran:
            raise RuntimeError("this round trip has run; queue on a new one")
        if self._pipe is not None:
            self._pipe.execute_command(*command)
        self._size += 1
        return Reply(self, self._size - 1)

    async def run(self) -> None:
        """Send every queued command at once (nothing is sent when none is queued)."""
        if self._ran:
            return
        self._ran = True
        if self._pipe is None or not self._size or self._error is not None:
            return
        try:
            self._replies = await self._pipe.execute(raise_on_error=False)
        except UNREACHABLE as exc:
            self._error = exc

    def reply(self, index: int) -> Any:
        if not self._ran:
            raise RuntimeError("read a reply after the round trip has run")
        if self._error is not None:
            raise self._error
        value = self._replies[index]
        if isinstance(value, RedisError):  # this command alone failed (NOSCRIPT, WRONGTYPE)
            raise value
        return value
