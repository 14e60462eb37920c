"""Limits that protect the service: request body size, request rates per IP and per key.

Counters live in Redis (fixed one-minute windows) so every gateway replica shares them;
without Redis, or while it is unreachable, each replica counts on its own and keeps serving.
"""

from __future__ import annotations

import logging
import math
import time

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

RATE_LIMITED = Counter("engram_rate_limited_total", "Requests refused by a rate limit", ["limit"])

WINDOW_SECONDS = 60


class RateLimiter:
    def __init__(self, redis: aioredis.Redis | None, prefix: str = "engram:rl") -> None:
        self.redis = redis
        self.prefix = prefix
        self._local: dict[str, int] = {}
        self._local_window = 0

    def _window(self, name: str, subject: str) -> tuple[str, int, int]:
        """This window's counter key, the window's number and the seconds until it resets."""
        now = time.time()
        window = int(now // WINDOW_SECONDS)
        retry_after = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
        return f"{self.prefix}:{name}:{subject}:{window}", window, retry_after

    async def hit(self, name: str, subject: str, limit: int) -> tuple[bool, int]:
        """Count one request; (allowed, seconds until the window resets)."""
        key, window, retry_after = self._window(name, subject)
        if limit <= 0:
            return True, retry_after
        count = None
        if self.redis is not None:
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.incr(key)
                pipe.expire(key, WINDOW_SECONDS + 5)
                count = int((await pipe.execute())[0])
            except (RedisError, OSError):
                logger.debug("rate limit counter unavailable in Redis; counting locally", exc_info=True)
        if count is None:
            if window != self._local_window:
                self._local.clear()
                self._local_window = window
            count = self._local[key] = self._local.get(key, 0) + 1
        allowed = count <= limit
        if not allowed:
            RATE_LIMITED.labels(name).inc()
        return allowed, retry_after

    async def exceeded(self, name: str, subject: str, limit: int) -> tuple[bool, int]:
        """Whether `subject` is already past `limit` in this window, without counting: for
        limits that count only failures (wrong keys at the OAuth consent form), checked before
        the attempt so that a throttled caller cannot learn whether its next guess is right."""
        key, window, retry_after = self._window(name, subject)
        if limit <= 0:
            return False, retry_after
        count = None
        if self.redis is not None:
            try:
                count = int(await self.redis.get(key) or 0)
            except (RedisError, OSError):
                logger.debug("rate limit counter unavailable in Redis; reading the local count", exc_info=True)
        if count is None:
            count = self._local.get(key, 0) if window == self._local_window else 0
        return count >= limit, retry_after


def body_limit_for(path: str, default: int) -> int:
    # seed: the admin import path takes up to 50 MiB; everything else the default (1 MiB).
    if path == "/v1/internal/model/nothing/import":
        return 50 * 1024 * 1024
    # reference 001: POST /memory/import alone is raised to MEMORY_IMPORT_BODY_LIMIT_BYTES.
    if path == "/api/v1/memory/import":
        return 50 * 1024 * 1024
    return default
