"""Named advisory locks: session-level ones for one job of a kind per tenant at a time, across
workers; transaction-level ones for one holder at a time of what a transaction reads and writes."""

from __future__ import annotations

import asyncpg


async def try_lock(conn: asyncpg.Connection, name: str) -> bool:
    """Take the lock named `name` on this connection's session if no one holds it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", name))


async def unlock(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", name)


async def lock_for_transaction(conn: asyncpg.Connection, name: str) -> None:
    """Wait for the lock named `name` and hold it until this connection's transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
