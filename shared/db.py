"""The asyncpg pool every service and task uses: pgvector codec, schema search path."""

from __future__ import annotations

import asyncpg
from pgvector.asyncpg import register_vector

SEARCH_PATH = "agent_memory,public"


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, server_settings: dict[str, str] | None = None,
) -> asyncpg.Pool:
    """server_settings are startup parameters on top of the search path (per-service planner
    settings such as vector_search.graph_settings()): a connection's RESET ALL, which the pool
    runs on every release, returns each to its startup value. A `SET` run once on a new
    connection is gone after its first release: until session 18 the recall service set its
    HNSW iterative scan that way, and every filtered graph walk after a connection's first
    ran without it (bench/README.md)."""

    async def init(conn: asyncpg.Connection) -> None:
        await register_vector(conn)

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


async def create_replica_pool(dsn: str, *, max_size: int = 10, server_settings: dict[str, str] | None = None) -> asyncpg.Pool:
    """A pool on a read replica (shared/read_routing.py). It opens no connection until a read
    needs one, so a standby that is down at start-up costs nothing but its health checks, and
    its connections are named apart from the primary's in pg_stat_activity."""
    return await create_pool(
        dsn, min_size=0, max_size=max_size,
        server_settings={**(server_settings or {}), "application_name": "engram-replica-read"},
    )
