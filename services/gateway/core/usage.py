"""Tool calls per key per UTC day, for `daily_limit` and the admin's `calls_today`.

With Redis the count lives there (one INCR per call, shared by every replica) and reaches
api_key_daily_usage in the background (every FLUSH_SECONDS, and before the admin lists keys),
so a call costs no database write. A counter Redis does not have yet (a new day, a Redis
restart) starts from what Postgres holds. Without Redis, or while it is unreachable, each
call is counted in Postgres as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter as Tally
from datetime import UTC, date, datetime

import asyncpg
import redis.asyncio as aioredis

from services.gateway.core.round_trip import UNREACHABLE
from services.gateway.sessions import Gate
from shared import background
from shared.repositories import keys as keys_repo

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
# A day's counter outlives its day long enough for a late flush and clock skew.
COUNTER_TTL_SECONDS = 2 * 86400


def utc_today() -> date:
    return datetime.now(UTC).date()


class DailyCalls:
    def __init__(self, pool: asyncpg.Pool, redis: aioredis.Redis | None, prefix: str = "engram:calls") -> None:
        self.pool = pool
        self.redis = redis
        self.prefix = prefix
        # Calls Redis counted that Postgres has not been told about yet.
        self._unflushed: Tally[tuple[str, date]] = Tally()
        self._flusher: asyncio.Task[None] | None = None
        # One flush at a time: the last one (aclose) waits for a background one still writing.
        self._flushing = asyncio.Lock()

    def _counter(self, key_id: str, day: date) -> str:
        return f"{self.prefix}:{key_id}:{day.isoformat()}"

    def gate(self, key_id: str, limit: int) -> Gate | None:
        """Today's counter of the key as a gate for the call's record (sessions/), so the call
        is counted in the round trip that records it; None without Redis."""
        if self.redis is None:
            return None
        return Gate(self._counter(key_id, utc_today()), limit, COUNTER_TTL_SECONDS)

    async def count(self, key_id: str) -> int:
        """Count one call; returns the key's calls today, this one included."""
        if self.redis is not None:
            name = self._counter(key_id, utc_today())
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.incr(name)
                pipe.expire(name, COUNTER_TTL_SECONDS)
                calls = int((await pipe.execute())[0])
            except UNREACHABLE:
                logger.debug("daily call counter unavailable in Redis; counting in Postgres", exc_info=True)
            else:
                return await self.counted(key_id, calls)
        async with self.pool.acquire() as conn:
            return await keys_repo.count_call(conn, key_id)

    async def counted(self, key_id: str, calls: int | None) -> int:
        """The key's calls today after one call was counted in Redis (`calls`, from its gate or
        count()); None: the call was not counted yet, so count it now."""
        if calls is None:
            return await self.count(key_id)
        day = utc_today()
        if calls == 1 and self.redis is not None:  # a counter Redis did not have: add what Postgres knows
            async with self.pool.acquire() as conn:
                stored = await keys_repo.calls_on(conn, key_id, day)
            if stored:
                try:
                    calls = int(await self.redis.incrby(self._counter(key_id, day), stored))
                except UNREACHABLE:
                    calls += stored
        self._unflushed[(key_id, day)] += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        return calls

    async def _flush_loop(self) -> None:
        while self._unflushed:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                # Shielded: a cancel (aclose) must not land between a row's INSERT and its
                # answer, or the row is put back as unwritten and counted twice.
                await asyncio.shield(self.flush())
            except (asyncpg.PostgresError, OSError):
                logger.warning("daily call counts not written; retrying", exc_info=True)

    async def flush(self) -> None:
        """Write the calls counted in Redis to api_key_daily_usage."""
        async with self._flushing:
            pending, self._unflushed = self._unflushed, Tally()
            if not pending:
                return
            try:
                async with self.pool.acquire() as conn:
                    for (key_id, day), calls in list(pending.items()):
                        # The key may have been deleted meanwhile; its usage went with it.
                        with contextlib.suppress(asyncpg.ForeignKeyViolationError):
                            await keys_repo.add_calls(conn, key_id, day, calls)
                        del pending[(key_id, day)]
            finally:
                self._unflushed.update(pending)  # what was not written goes in the next flush

    async def aclose(self) -> None:
        """Stop the background flusher (a flush it has begun runs to its end) and write the rest."""
        await background.stop(self._flusher)
        await self.flush()
