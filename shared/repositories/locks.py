"""Session-level advisory locks: one job of a kind per tenant at a time, across workers."""

from __future__ import annotations

import asyncpg


async def try_lock(conn: asyncpg.Connection, name: str) -> bool:
    """Take the lock named `name` on this connection's session if no one holds it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", name))


async def unlock(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", name)
