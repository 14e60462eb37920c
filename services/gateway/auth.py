"""Bearer credentials -> Principal: the master key, or an API key (stored hashed)."""

from __future__ import annotations

import hmac
import time

import asyncpg

from shared.domain.principal import Principal
from shared.repositories import keys as keys_repo
from shared.repositories import oauth as oauth_repo

# OAuth access tokens issued by /token (services/gateway/oauth.py).
OAUTH_TOKEN_PREFIX = "oat_"

# Key lookups are cached briefly so a busy agent costs one query per 10 s, and a revoked
# key stops working within that time.
KEY_CACHE_SECONDS = 10.0


class Authenticator:
    def __init__(self, master_key: str, pool: asyncpg.Pool) -> None:
        self._master_key = master_key
        self._pool = pool
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        if self._master_key and hmac.compare_digest(token.encode(), self._master_key.encode()):
            return Principal.master()
        is_oauth = token.startswith(OAUTH_TOKEN_PREFIX)
        if not token.startswith(keys_repo.KEY_PREFIX) and not is_oauth:
            return None
        digest = keys_repo.hash_key(token)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached and cached[0] > now:
            return cached[1]
        async with self._pool.acquire() as conn:
            if is_oauth:
                principal = await self._oauth_principal(conn, token)
            else:
                principal = await keys_repo.principal_for_raw_key(conn, token)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now + KEY_CACHE_SECONDS, principal)
        return principal

    @staticmethod
    async def _oauth_principal(conn: asyncpg.Connection, token: str) -> Principal | None:
        row = await oauth_repo.get_token(conn, token)
        if row is None:
            return None
        if row["key_id"] is None:  # consented with the master key
            return Principal.master()
        return await keys_repo.principal_for_key_id(conn, row["key_id"])

    def forget_cached(self) -> None:
        self._cache.clear()


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
