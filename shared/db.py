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


async def create_replica_pool(dsn: str, *, max_size: int = 10, session_sql: str | None = None) -> asyncpg.Pool:
    """A pool on a read replica (shared/read_routing.py). It opens no connection until a read
    needs one, so a standby that is down at start-up costs nothing but its health checks, and
    its connections are named apart from the primary's in pg_stat_activity."""
    return await create_pool(
        dsn, min_size=0, max_size=max_size, session_sql=session_sql,
        server_settings={"application_name": "engram-replica-read"},
    )
