"""Limits that protect the service: request body size, request rates per IP and per key.

Counters live in Redis (fixed one-minute windows) so every gateway replica shares them;
without Redis, or while it is unreachable, each replica counts on its own and keeps serving.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from prometheus_client import Counter

from services.gateway.core.round_trip import UNREACHABLE, Reply, RoundTrip

logger = logging.getLogger(__name__)

RATE_LIMITED = Counter("engram_rate_limited_total", "Requests refused by a rate limit", ["limit"])

WINDOW_SECONDS = 60


@dataclass(frozen=True)
class Hit:
    """One request counted against a limit, its count to be read after its round trip."""

    name: str
    key: str
    window: int
    retry_after: int
    limit: int
    reply: Reply | None  # the INCR's; None when not counted in Redis


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
        trip = RoundTrip(self.redis)
        hit = self.queue_hit(trip, name, subject, limit)
        await trip.run()
        return self.counted(hit)

    def queue_hit(self, trip: RoundTrip, name: str, subject: str, limit: int) -> Hit:
        """Count one request in a request's round trip (core/round_trip.py); counted() reads it."""
        key, window, retry_after = self._window(name, subject)
        reply = None
        if limit > 0 and self.redis is not None:
            reply = trip.queue("INCR", key)
            trip.queue("EXPIRE", key, WINDOW_SECONDS + 5)
        return Hit(name, key, window, retry_after, limit, reply)

    def counted(self, hit: Hit) -> tuple[bool, int]:
        """(allowed, seconds until the window resets) for a hit whose round trip has run."""
        if hit.limit <= 0:
            return True, hit.retry_after
        count = None
        if hit.reply is not None:
            try:
                count = int(hit.reply.result())
            except UNREACHABLE:
                logger.debug("rate limit counter unavailable in Redis; counting locally", exc_info=True)
        if count is None:
            if hit.window != self._local_window:
                self._local.clear()
                self._local_window = hit.window
            count = self._local[hit.key] = self._local.get(hit.key, 0) + 1
        allowed = count <= hit.limit
        if not allowed:
            RATE_LIMITED.labels(hit.name).inc()
        return allowed, hit.retry_after

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
            except UNREACHABLE:
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
