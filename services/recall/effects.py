"""Recall's side effects (search events, access counts, last access, activation), written
after the response and never lost.

With Redis each effect is one LPUSH onto a shared list; a drainer in every replica moves
batches to its own processing list (LMOVE, the reliable-queue pattern), applies them in one
transaction, then drops them. The drainer polls rather than blocks (BLMOVE): the client's
socket timeout is short (shared/redis_breaker.py) so that a hung Redis costs a recall
little, and a blocking wait longer than it would read as a failure. A replica that died mid-batch finds its processing list on the
next start and replays it (event rows are upserts by id). Without Redis the effect is applied
by a task on this process right after the response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any

import asyncpg
from redis.exceptions import RedisError

from shared.repositories import events as events_repo

logger = logging.getLogger(__name__)

QUEUE = "engram:recall:effects"
ALIVE = "engram:recall:effects:alive:{replica}"
# The replicas that keep a processing list: each adds itself at every heartbeat, and a heartbeat
# that finds one whose ALIVE key has expired re-queues its list and takes it off. Heartbeats
# used to SCAN the whole keyspace for processing lists (the recall cache's and the shared
# document frequencies' keys with them: ~4.7k keys, 47 round trips, on the 1M bench store, and
# one key per tenant scope and term with many tenants) every ~10 s on every replica; now only a
# replica's first heartbeat does, for the lists of replicas that never listed themselves here.
REPLICAS = "engram:recall:effects:replicas"
# A replica that has not refreshed its heartbeat for this long is gone: its unfinished batch
# goes back on the shared queue for the others.
HEARTBEAT_TTL_S = 30
# Up to this many effects per transaction; a burst of 200 recalls drains in a few batches.
BATCH = 200
# After a partial batch the drainer waits this long, so one-at-a-time recalls are applied a
# few at a time: one transaction (and one UPDATE of each fragment returned again) per
# interval, not per query. Each effect still lands within about this much of its recall.
COALESCE_S = 0.25
# The longest pause between two tries of the drainer while Redis or Postgres is away.
RETRY_MAX_S = 10.0
# Moves up to ARGV[1] effects from the shared queue (KEYS[1]) to a replica's processing list
# (KEYS[2]), each LMOVE atomic as before, in one command; returns how many it moved. A drain
# used to send BATCH LMOVEs in a pipeline, nearly all of them answering nil (a drain every
# ~0.25 s finds a few effects): packing 199 commands and parsing 199 replies held the recall
# replica's event loop ~4.7 ms a drain, five effects queued, on a slow 2-core machine (this
# script: 0.15 ms), while the recalls in flight waited (bench/README.md, session 32).
_MOVE = """
local moved = 0
for _ = 1, tonumber(ARGV[1]) do
  if not redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT') then break end
  moved = moved + 1
end
return moved
"""


class SideEffects:
    def __init__(self, pool: asyncpg.Pool, redis: Any | None, replica: str) -> None:
        self._pool = pool
        self._redis = redis
        self._move = redis.register_script(_MOVE) if redis is not None else None
        self._replica = replica or socket.gethostname()
        self._processing = f"{QUEUE}:processing:{self._replica}"
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        # The loop and an explicit flush share one processing list: one batch at a time.
        self._lock = asyncio.Lock()

    async def submit(self, effect: dict[str, Any]) -> None:
        if self._redis is not None:
            try:
                await self._redis.lpush(QUEUE, json.dumps(effect, default=str))
                return
            except RedisError:
                logger.warning("effects queue unavailable; applying in process")
        task = asyncio.create_task(self._apply([effect]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, effects: list[dict[str, Any]]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await events_repo.apply_recall_effects(conn, effects)

    async def drain_once(self, wait: float = 1.0) -> int:
        """Move one batch to this replica's processing list, apply it, drop it; with the
        queue empty, wait `wait` seconds and return 0."""
        if self._redis is None:  # without Redis every effect is applied in process (apply())
            return 0
        async with self._lock:
            drained = await self._drain_locked(self._redis)
        if not drained:
            await asyncio.sleep(wait)
        return drained

    async def _drain_locked(self, redis: Any) -> int:
        if self._move is None or not int(await self._move(keys=[QUEUE, self._processing], args=[BATCH], client=redis)):
            return 0
        return await self._flush_processing(redis)

    async def _flush_processing(self, redis: Any) -> int:
        raw = await redis.lrange(self._processing, 0, -1)
        if not raw:
            return 0
        effects = []
        for item in raw:
            try:
                effects.append(json.loads(item))
            except ValueError:
                logger.warning("dropping an unreadable recall effect")
        if effects:
            try:
                await self._apply(effects)
            except asyncpg.DataError:
                # A malformed batch would block the queue forever: log it and move on.
                logger.exception("dropping %d recall effects that cannot be applied", len(effects))
        await redis.ltrim(self._processing, len(raw), -1)
        return len(raw)

    async def flush(self) -> None:
        """Apply everything queued now (tool_feedback and tests call this; also on shutdown).
        Best effort: with Redis away the queue waits for the drainer, and the caller goes on."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._redis is None:
            return
        try:
            while await self.drain_once(wait=0):
                pass
        except RedisError:
            logger.warning("recall effects queue unavailable; queued effects land when it is back")

    async def run(self) -> None:
        """The drainer loop of this replica; replays its own unfinished batch first."""
        redis = self._redis
        if redis is None:
            return
        failures = 0
        scanned = False
        while not self._stopping.is_set():
            try:
                async with self._lock:
                    await self._flush_processing(redis)
                beats = 0
                while not self._stopping.is_set():
                    if beats % 40 == 0:  # every ~10 s when idle
                        await self._heartbeat_and_adopt(redis, scan=not scanned)
                        scanned = True
                    beats += 1
                    if 0 < await self.drain_once(wait=0.25) < BATCH:
                        await asyncio.sleep(COALESCE_S)
                    failures = 0
            except (RedisError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                # One trace per outage, then quiet retries further apart (effects submitted
                # meanwhile are applied in process, so nothing piles up in Redis).
                failures += 1
                if failures == 1:
                    logger.exception("recall effects drainer failed; retrying")
                await asyncio.sleep(min(RETRY_MAX_S, float(failures)))

    async def _heartbeat_and_adopt(self, redis: Any, scan: bool = False) -> None:
        """Refresh this replica's heartbeat and listing; put the processing lists of listed
        replicas whose heartbeat has expired back on the shared queue. With `scan`, also those
        of replicas found by a scan of the keyspace (listed or not)."""
        if self._move is None:  # without Redis there are no processing lists
            return
        pipe = redis.pipeline(transaction=False)
        pipe.set(ALIVE.format(replica=self._replica), "1", ex=HEARTBEAT_TTL_S)
        pipe.sadd(REPLICAS, self._replica)
        pipe.smembers(REPLICAS)
        listed = (await pipe.execute())[-1]
        owners = {m.decode() if isinstance(m, bytes) else m for m in listed}
        if scan:
            async for raw in redis.scan_iter(match=f"{QUEUE}:processing:*", count=1000):
                owners.add((raw.decode() if isinstance(raw, bytes) else raw).removeprefix(f"{QUEUE}:processing:"))
        for owner in sorted(owners - {self._replica}):
            if await redis.exists(ALIVE.format(replica=owner)):
                continue
            moved = 0
            while step := int(await self._move(keys=[f"{QUEUE}:processing:{owner}", QUEUE], args=[BATCH], client=redis)):
                moved += step
            # A replica that comes back lists itself again at its next heartbeat.
            await redis.srem(REPLICAS, owner)
            if moved:
                logger.warning("re-queued %d recall effects left by replica %s", moved, owner)

    async def stop(self) -> None:
        self._stopping.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
