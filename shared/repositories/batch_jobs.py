"""The async batch_remember queue: a reliable Redis queue (seed: RPOPLPUSH + processing list).

    queue       LIST  job ids waiting (LPUSH in, taken from the right)
    processing  LIST  job ids a consumer holds (LMOVE queue -> processing, atomic)
    dead        LIST  job ids that failed every attempt
    job:<id>    HASH  state, counts, attempts, lease, cursor, payload

A job leaves `processing` only when it is acknowledged (completed or dead-lettered) or when
its lease runs out and `recover` puts it back on the queue — so a consumer killed mid-job
loses nothing. Work done before the kill is not redone twice: every item carries an
idempotency key (jobId#index) that the write path honours.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

DEFAULT_PREFIX = "engram:batch"
# A finished job's status stays readable for a week.
JOB_TTL_SECONDS = 7 * 24 * 3600
# seed: up to 3 retries, then dead-letter.
MAX_ATTEMPTS = 4

_REQUEUE = """
local n = redis.call('LREM', KEYS[1], 1, ARGV[1])
if n > 0 then
  redis.call('HSET', KEYS[3], 'state', 'queued')
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
return n
"""
_DEAD_LETTER = """
local n = redis.call('LREM', KEYS[1], 1, ARGV[1])
if n > 0 then redis.call('LPUSH', KEYS[2], ARGV[1]) end
redis.call('HSET', KEYS[3], 'state', 'dead', 'error', ARGV[2])
return n
"""


def new_job_id() -> str:
    """seed: "batch-<epoch ms>-<8 hex>"."""
    return f"batch-{int(time.time() * 1000)}-{secrets.token_hex(4)}"


def _now() -> float:
    return time.time()


@dataclass
class Claimed:
    job_id: str
    attempts: int
    payload: dict[str, Any]
    cursor: int
    processed: int
    failed: int


class BatchQueue:
    def __init__(self, redis: Redis, prefix: str = DEFAULT_PREFIX, lease_seconds: float = 60.0,
                 max_attempts: int = MAX_ATTEMPTS) -> None:
        self.redis = redis
        self.prefix = prefix
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.queue = f"{prefix}:queue"
        self.processing = f"{prefix}:processing"
        self.dead = f"{prefix}:dead"
        self._requeue = redis.register_script(_REQUEUE)
        self._dead_letter = redis.register_script(_DEAD_LETTER)

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    # -- producer ---------------------------------------------------------------------
    async def enqueue(self, job_id: str, payload: dict[str, Any], *, accepted: int, rejected: int, key_id: str | None) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.job_key(job_id), mapping={
                "state": "queued", "accepted": accepted, "rejected": rejected, "processed": 0, "failed": 0,
                "attempts": 0, "cursor": 0, "key_id": key_id or "", "created_at": int(_now() * 1000),
                "payload": json.dumps(payload, ensure_ascii=False),
            })
            pipe.expire(self.job_key(job_id), JOB_TTL_SECONDS)
            pipe.lpush(self.queue, job_id)
            await pipe.execute()

    async def status(self, job_id: str) -> dict[str, str] | None:
        data = await self.redis.hgetall(self.job_key(job_id))
        if not data:
            return None
        return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v for k, v in data.items()}

    # -- consumer ---------------------------------------------------------------------
    async def claim(self) -> Claimed | None:
        """Take the oldest job into `processing` with a fresh lease; a job past its last
        attempt goes to the dead letters instead."""
        while True:
            raw = await self.redis.lmove(self.queue, self.processing, "RIGHT", "LEFT")
            if raw is None:
                return None
            job_id = raw.decode() if isinstance(raw, bytes) else raw
            key = self.job_key(job_id)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(key, "attempts", 1)
                pipe.hset(key, mapping={"state": "processing", "lease_until": _now() + self.lease_seconds})
                pipe.hmget(key, "payload", "cursor", "processed", "failed")
                attempts, _, (payload, cursor, processed, failed) = await pipe.execute()
            if payload is None:  # status expired or never written: nothing to do
                await self.redis.lrem(self.processing, 1, job_id)
                continue
            if attempts > self.max_attempts:
                await self.dead_letter(job_id, "attempts exhausted")
                continue
            return Claimed(job_id, int(attempts), json.loads(payload), int(cursor or 0), int(processed or 0), int(failed or 0))

    async def progress(self, job_id: str, *, cursor: int, processed: int, failed: int) -> None:
        """A chunk committed: move the cursor and extend the lease in one step."""
        await self.redis.hset(self.job_key(job_id), mapping={
            "cursor": cursor, "processed": processed, "failed": failed, "lease_until": _now() + self.lease_seconds,
        })

    async def complete(self, job_id: str) -> None:
        """Acknowledge: the job leaves `processing` only now."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.job_key(job_id), mapping={"state": "completed", "finished_at": int(_now() * 1000)})
            pipe.lrem(self.processing, 1, job_id)
            await pipe.execute()

    async def retry_later(self, job_id: str, attempts: int, error: str) -> bool:
        """A failed attempt: dead-letter after the last one, else leave the job in
        `processing` with a short lease (the back-off) for `recover` to requeue. Returns
        True when it was dead-lettered."""
        if attempts >= self.max_attempts:
            await self.dead_letter(job_id, error)
            return True
        backoff = min(self.lease_seconds, 2.0 ** attempts)
        await self.redis.hset(self.job_key(job_id), mapping={
            "state": "queued", "error": error[:500], "lease_until": _now() + backoff,
        })
        return False

    async def dead_letter(self, job_id: str, error: str) -> None:
        await self._dead_letter(keys=[self.processing, self.dead, self.job_key(job_id)], args=[job_id, error[:500]])

    async def recover(self) -> list[str]:
        """Requeue every held job whose lease ran out (its consumer died or is backing off)."""
        moved: list[str] = []
        now = _now()
        for raw in await self.redis.lrange(self.processing, 0, -1):
            job_id = raw.decode() if isinstance(raw, bytes) else raw
            lease = await self.redis.hget(self.job_key(job_id), "lease_until")
            if lease is not None and float(lease) > now:
                continue
            if await self._requeue(keys=[self.processing, self.queue, self.job_key(job_id)], args=[job_id]):
                moved.append(job_id)
        return moved

    async def pending(self) -> int:
        return int(await self.redis.llen(self.queue))
