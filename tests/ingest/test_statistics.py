"""A young store's planner statistics are refreshed by the write that outgrows them."""

from __future__ import annotations

import asyncio

import asyncpg

from shared.db import SEARCH_PATH
from shared.repositories import fragments as fragments_repo
from shared.repositories import locks
from tests.support import Stack, call, mcp_session, unique


async def _analyze_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(
        "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relid = 'fragments'::regclass"
    ))


async def test_statistics_follow_a_write_that_outgrows_them(stack: Stack) -> None:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        async with mcp_session(stack.mcp_url, stack.master_key) as s:
            await call(s, "batch_remember", {"workspace": unique(), "fragments": [
                {"content": f"Statistics probe number {i} for the planner.", "topic": "stats", "type": "fact"}
                for i in range(3)]})
        known = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments'::regclass")
        assert known >= 0  # analysed by now (never analysed: the first batch refreshes)
        before = await _analyze_count(conn)
        # a write far below the share the statistics know of leaves them alone ...
        assert not await fragments_repo.refresh_statistics_if_young(conn, 0)
        # ... one that outgrows them refreshes them
        assert await fragments_repo.refresh_statistics_if_young(conn, int(known) + 1)
        for _ in range(50):  # the cumulative statistics are published shortly after
            if await _analyze_count(conn) > before:
                break
            await asyncio.sleep(0.1)
        assert await _analyze_count(conn) > before
    finally:
        await conn.close()


async def test_one_young_store_refresh_at_a_time(stack: Stack) -> None:
    """A write that outgrows the statistics while another connection refreshes them leaves
    the refresh to it (concurrent batches on a young store each ran their own ANALYZEs)."""
    holder = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        known = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments'::regclass")
        outgrowing = max(int(known), 0) + 1
        assert await locks.try_lock(holder, fragments_repo.YOUNG_STORE_LOCK)  # a refresh under way
        assert not await fragments_repo.refresh_statistics_if_young(conn, outgrowing)
        await locks.unlock(holder, fragments_repo.YOUNG_STORE_LOCK)  # ... and done
        assert await fragments_repo.refresh_statistics_if_young(conn, outgrowing)
        # the lock is released after the refresh: the next one can take it
        assert await locks.try_lock(holder, fragments_repo.YOUNG_STORE_LOCK)
        await locks.unlock(holder, fragments_repo.YOUNG_STORE_LOCK)
    finally:
        await conn.close()
        await holder.close()
