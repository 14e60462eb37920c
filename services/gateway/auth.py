"""Bearer credentials -> Principal: the master key, or an API key (stored hashed)."""

from __future__ import annotations

import hmac
import logging
import time

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared.domain.principal import Principal
from shared.repositories import keys as keys_repo
from shared.repositories import oauth as oauth_repo

# OAuth access tokens issued by /token (services/gateway/oauth.py).
OAUTH_TOKEN_PREFIX = "oat_"

logger = logging.getLogger(__name__)

# Key lookups are cached briefly so a busy agent costs one query per 10 s. A change made
# through the admin API bumps a generation in Redis that every replica reads per request,
# so a key set inactive or deleted stops working at once everywhere; without Redis, at
# once on the replica that made the change and within this time on the others.
KEY_CACHE_SECONDS = 10.0
GENERATION_KEY = "engram:keys:generation"


class Authenticator:
    def __init__(self, master_key: str, pool: asyncpg.Pool, redis: aioredis.Redis | None = None) -> None:
        self._master_key = master_key
        self._pool = pool
        self._redis = redis
        self._cache: dict[str, tuple[float, bytes | None, Principal | None]] = {}

    async def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        if self._master_key and hmac.compare_digest(token.encode(), self._master_key.encode()):
            return Principal.master()
        is_oauth = token.startswith(OAUTH_TOKEN_PREFIX)
        if not token.startswith(keys_repo.KEY_PREFIX) and not is_oauth:
            return None
        digest = keys_repo.hash_key(token)
        generation = await self._generation()
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached and cached[0] > now and cached[1] == generation:
            return cached[2]
        async with self._pool.acquire() as conn:
            if is_oauth:
                principal = await self._oauth_principal(conn, token)
            else:
                principal = await keys_repo.principal_for_raw_key(conn, token)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now + KEY_CACHE_SECONDS, generation, principal)
        return principal

    async def _generation(self) -> bytes | None:
        if self._redis is None:
            return None
        try:
            return await self._redis.get(GENERATION_KEY)
        except (RedisError, OSError):
            logger.debug("key generation unavailable in Redis; the cache expires by time", exc_info=True)
            return None

    @staticmethod
    async def _oauth_principal(conn: asyncpg.Connection, token: str) -> Principal | None:
        row = await oauth_repo.get_token(conn, token)
        if row is None:
            return None
        if row["key_id"] is None:  # consented with the master key
            return Principal.master()
        return await keys_repo.principal_for_key_id(conn, row["key_id"])

    async def forget_cached(self) -> None:
        """A key or group changed: drop cached credentials here and on every replica."""
        self._cache.clear()
        if self._redis is not None:
            try:
                await self._redis.incr(GENERATION_KEY)
            except (RedisError, OSError):
                logger.warning("key change not announced in Redis; other replicas see it within %.0f s", KEY_CACHE_SECONDS)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
