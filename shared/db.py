"""The asyncpg pool every service and task uses: pgvector codec, schema search path."""

from __future__ import annotations

import asyncpg
from pgvector.asyncpg import register_vector

SEARCH_PATH = "agent_memory,public"


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, session_sql: str | None = None,
    server_settings: dict[str, str] | None = None,
) -> asyncpg.Pool:
    """session_sql runs once on every new connection (per-service planner settings);
    server_settings are more startup parameters (they outlive the pool's RESET ALL)."""

    async def init(conn: asyncpg.Connection) -> None:
        await register_vector(conn)
        if session_sql:
            await conn.execute(session_sql)

    return await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init,
        server_settings={"search_path": SEARCH_PATH, "application_name": "engram", **(server_settings or {})},
        command_timeout=30,
        # A new connection to a Postgres that hangs (network partition, a host gone) fails
        # after this instead of asyncpg's 60 s default, so callers answer 503 while it is away.
        timeout=5,
    )


async def ping(pool: asyncpg.Pool) -> None:
    async with pool.acquire(timeout=2) as conn:
        await conn.fetchval("SELECT 1", timeout=2)
