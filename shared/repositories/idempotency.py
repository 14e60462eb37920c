"""Idempotency records: (key, idempotencyKey) -> the fragment the first call created."""

from __future__ import annotations

import asyncpg


def _owner(key_id: str | None) -> str:
    # The master key's records live under '' (the column is part of the primary key).
    return key_id or ""


async def lookup(conn: asyncpg.Connection, key_id: str | None, keys: list[str]) -> dict[str, str]:
    if not keys:
        return {}
    rows = await conn.fetch(
        "SELECT idempotency_key, fragment_id FROM idempotency_records WHERE key_id = $1 AND idempotency_key = ANY($2::text[])",
        _owner(key_id), keys,
    )
    return {r["idempotency_key"]: r["fragment_id"] for r in rows}


async def claim(conn: asyncpg.Connection, key_id: str | None, pairs: list[tuple[str, str]]) -> set[str]:
    """Claim idempotency keys for new fragment ids; returns the keys this call won. A key a
    concurrent transaction holds makes this wait for it, then lose (ON CONFLICT)."""
    if not pairs:
        return set()
    rows = await conn.fetch(
        """
        INSERT INTO idempotency_records (key_id, idempotency_key, fragment_id)
        SELECT $1, k, f FROM unnest($2::text[], $3::text[]) AS q(k, f)
        ON CONFLICT DO NOTHING RETURNING idempotency_key
        """,
        _owner(key_id), [k for k, _ in pairs], [f for _, f in pairs],
    )
    return {r["idempotency_key"] for r in rows}


async def release(conn: asyncpg.Connection, key_id: str | None, keys: list[str]) -> None:
    if keys:
        await conn.execute(
            "DELETE FROM idempotency_records WHERE key_id = $1 AND idempotency_key = ANY($2::text[])", _owner(key_id), keys
        )
