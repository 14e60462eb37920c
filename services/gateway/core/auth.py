"""Bearer credentials -> Principal: the master key, or an API key (stored hashed)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

import asyncpg
import redis.asyncio as aioredis
from cachetools import TTLCache
from redis.exceptions import RedisError

from shared.domain.principal import Principal
from shared.repositories import keys as keys_repo
from shared.repositories import oauth as oauth_repo

# OAuth access tokens issued by /token (services/gateway/oauth.py).
OAUTH_TOKEN_PREFIX = "oat_"  # noqa: S105 - a prefix, not a secret

logger = logging.getLogger(__name__)

# Key lookups are cached briefly so a busy agent costs one query per 10 s. A change made
# through the admin API bumps a generation in Redis that every replica reads per request,
# so a key set inactive or deleted stops working at once everywhere; without Redis, at
# once on the replica that made the change and within this time on the others.
KEY_CACHE_SECONDS = 10.0
KEY_CACHE_SIZE = 10_000
GENERATION_KEY = "engram:keys:generation"
# A credential check waits this long for a pooled connection; past it the caller gets a 503
# (services/gateway/unavailable.py) rather than a request that hangs with the pool.
POOL_ACQUIRE_SECONDS = 5.0
# Cache entries of the key behind a session, beside the token digests (hex, never this prefix).
_KEY_ID_ENTRY = "key-id:"


class Authenticator:
    def __init__(self, master_key: str, pool: asyncpg.Pool, redis: aioredis.Redis | None = None) -> None:
        self._master_key = master_key
        self._pool = pool
        self._redis = redis
        # Token digest (or key id) -> (the generation it was read under, its principal).
        self._cache: TTLCache[str, tuple[bytes | None, Principal | None]] = TTLCache(KEY_CACHE_SIZE, KEY_CACHE_SECONDS)

    async def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        if self._master_key and hmac.compare_digest(token.encode(), self._master_key.encode()):
            return Principal.master()
        is_oauth = token.startswith(OAUTH_TOKEN_PREFIX)
        if not token.startswith(keys_repo.KEY_PREFIX) and not is_oauth:
            return None
        async def load(conn: asyncpg.Connection) -> Principal | None:
            if is_oauth:
                return await self._oauth_principal(conn, token)
            return await keys_repo.principal_for_raw_key(conn, token)

        return await self._cached(keys_repo.hash_key(token), load)

    async def principal_for_key(self, key_id: str | None) -> Principal | None:
        """The key behind a session, re-read for a request that carries only the session id:
        None once it is inactive or deleted. Same cache and generation as authenticate(), so
        an admin change reaches every replica's sessions at once (within KEY_CACHE_SECONDS
        without Redis)."""
        if key_id is None:  # the master key: configuration, not a row
            return Principal.master()
        return await self._cached(_KEY_ID_ENTRY + key_id, lambda conn: keys_repo.principal_for_key_id(conn, key_id))

    async def _cached(
        self, entry: str, load: Callable[[asyncpg.Connection], Awaitable[Principal | None]]
    ) -> Principal | None:
        """The cached principal of `entry` while the key generation is unchanged, else loaded."""
        generation = await self._generation()
        cached = self._cache.get(entry)
        if cached is not None and cached[0] == generation:
            return cached[1]
        async with self._pool.acquire(timeout=POOL_ACQUIRE_SECONDS) as conn:
            principal = await load(conn)
        self._cache[entry] = (generation, principal)
        return principal

    async def key_state(self, key_id: str) -> str:
        """Why a key no longer authenticates, for the error that ends its sessions."""
        async with self._pool.acquire(timeout=POOL_ACQUIRE_SECONDS) as conn:
            row = await keys_repo.get_key(conn, key_id)
        return "deleted" if row is None else str(row["status"])

    async def _generation(self) -> bytes | None:
        if self._redis is None:
            return None
        try:
            generation = await self._redis.get(GENERATION_KEY)
        except (RedisError, OSError):
            logger.debug("key generation unavailable in Redis; the cache expires by time", exc_info=True)
            return None
        return generation.encode() if isinstance(generation, str) else generation

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
