"""OAuth 2.0 clients, authorization codes and access tokens (codes and tokens stored hashed)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import same_tenant


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


async def create_client(
    conn: asyncpg.Connection, *, client_id: str, client_name: str | None, redirect_uris: list[str],
    key_id: str | None, metadata: dict[str, Any],
) -> asyncpg.Record | None:
    """Register (or, for an API-key-bound name, re-register) a client. None when the id is
    already another key's (`<name>_<keyIdHex8>` names only eight hex digits of the key id):
    only the key a client was registered with may change its redirect URIs."""
    return await conn.fetchrow(
        f"""
        INSERT INTO oauth_clients (client_id, client_name, redirect_uris, key_id, metadata)
        VALUES ($1, $2, $3, $4, $5::jsonb)
        ON CONFLICT (client_id) DO UPDATE SET client_name = EXCLUDED.client_name,
            redirect_uris = EXCLUDED.redirect_uris, metadata = EXCLUDED.metadata
        WHERE {same_tenant("oauth_clients", "EXCLUDED")}
        RETURNING *
        """,
        client_id, client_name, redirect_uris, key_id, json.dumps(metadata),
    )


async def get_client(conn: asyncpg.Connection, client_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM oauth_clients WHERE client_id = $1", client_id)


async def create_code(
    conn: asyncpg.Connection, *, code: str, client_id: str, key_id: str | None, redirect_uri: str,
    code_challenge: str, scopes: list[str], resource: str | None, expires_at: datetime,
) -> None:
    await conn.execute(
        """
        INSERT INTO oauth_codes (code_hash, client_id, key_id, redirect_uri, code_challenge, scopes, resource, expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        """,
        digest(code), client_id, key_id, redirect_uri, code_challenge, scopes, resource, expires_at,
    )


async def get_code(conn: asyncpg.Connection, code: str, client_id: str) -> asyncpg.Record | None:
    """The code, used or not (`used_at` says which)."""
    return await conn.fetchrow("SELECT * FROM oauth_codes WHERE code_hash = $1 AND client_id = $2", digest(code), client_id)


async def get_unused_code(conn: asyncpg.Connection, code: str, client_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM oauth_codes WHERE code_hash = $1 AND client_id = $2 AND used_at IS NULL", digest(code), client_id
    )


async def use_code(conn: asyncpg.Connection, code: str) -> bool:
    """Mark a code used; False when it already was (codes are single-use)."""
    return (
        await conn.fetchval(
            "UPDATE oauth_codes SET used_at = now() WHERE code_hash = $1 AND used_at IS NULL RETURNING true", digest(code)
        )
        is not None
    )


async def create_token(
    conn: asyncpg.Connection, *, token: str, client_id: str, key_id: str | None, scopes: list[str], expires_at: datetime,
    code: str | None = None,
) -> None:
    """`code`: the authorization code the token was issued from (a replay of it revokes the token)."""
    await conn.execute(
        "INSERT INTO oauth_tokens (token_hash, code_hash, client_id, key_id, scopes, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
        digest(token), digest(code) if code is not None else None, client_id, key_id, scopes, expires_at,
    )


async def revoke_tokens_of_code(conn: asyncpg.Connection, code: str) -> int:
    """Delete the tokens issued from a code (it was presented again); how many."""
    return len(await conn.fetch("DELETE FROM oauth_tokens WHERE code_hash = $1 RETURNING 1", digest(code)))


async def get_token(conn: asyncpg.Connection, token: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT * FROM oauth_tokens WHERE token_hash = $1 AND expires_at > now()", digest(token)
    )
