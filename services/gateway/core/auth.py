"""Bearer credentials -> Principal: the master key, or an API key (stored hashed)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

import asyncpg
import redis.asyncio as aioredis
from cachetools import TTLCache

from services.gateway.core.round_trip import UNREACHABLE, Reply, RoundTrip
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

    def is_master(self, token: str) -> bool:
        return bool(self._master_key) and hmac.compare_digest(token.encode(), self._master_key.encode())

    def queue_generation(self, trip: RoundTrip) -> Reply:
        """Read the key generation in a request's round trip (core/round_trip.py), for
        authenticate() and principal_for_key() to check their cache against."""
        return trip.queue("GET", GENERATION_KEY)

    def last_known(self, token: str) -> tuple[bool, Principal | None]:
        """(known, principal): what this token was when last checked here, without checking
        it again (whom to count a request against before its generation is read; never an
        authentication). Unknown when the key cache holds no entry for it."""
        if self.is_master(token):
            return True, Principal.master()
        if not self.is_key_shaped(token):
            return True, None
        cached = self._cache.get(keys_repo.hash_key(token))
        return (True, cached[1]) if cached is not None else (False, None)

    @staticmethod
    def is_key_shaped(token: str) -> bool:
        """An API key or an OAuth token: what the key cache and its generation check hold."""
        return token.startswith((keys_repo.KEY_PREFIX, OAUTH_TOKEN_PREFIX))

    async def authenticate(self, token: str | None, generation: Reply | None = None) -> Principal | None:
        """The token's principal, or None. `generation`: the key generation read in this
        request's round trip (read here when not given)."""
        if not token:
            return None
        if self.is_master(token):
            return Principal.master()
        if not self.is_key_shaped(token):
            return None
        is_oauth = token.startswith(OAUTH_TOKEN_PREFIX)

        async def load(conn: asyncpg.Connection) -> Principal | None:
            if is_oauth:
                return await self._oauth_principal(conn, token)
            return await keys_repo.principal_for_raw_key(conn, token)

        return await self._cached(keys_repo.hash_key(token), load, generation)

    async def principal_for_key(self, key_id: str | None, generation: Reply | None = None) -> Principal | None:
        """The key behind a session, re-read for a request that carries only the session id:
        None once it is inactive or deleted. Same cache and generation as authenticate(), so
        an admin change reaches every replica's sessions at once (within KEY_CACHE_SECONDS
        without Redis)."""
        if key_id is None:  # the master key: configuration, not a row
            return Principal.master()
        return await self._cached(
            _KEY_ID_ENTRY + key_id, lambda conn: keys_repo.principal_for_key_id(conn, key_id), generation
        )

    async def _cached(
        self, entry: str, load: Callable[[asyncpg.Connection], Awaitable[Principal | None]], read: Reply | None
    ) -> Principal | None:
        """The cached principal of `entry` while the key generation is unchanged, else loaded."""
        generation = await self._generation() if read is None else self._generation_from(read)
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
        except UNREACHABLE:
            logger.debug("key generation unavailable in Redis; the cache expires by time", exc_info=True)
            return None
        return generation.encode() if isinstance(generation, str) else generation

    @staticmethod
    def _generation_from(read: Reply) -> bytes | None:
        try:
            generation = read.result()
        except UNREACHABLE:
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
            except UNREACHABLE:
                logger.warning("key change not announced in Redis; other replicas see it within %.0f s", KEY_CACHE_SECONDS)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
