"""The gateway's daily call counts reach Postgres exactly once when it shuts down while a
background flush is writing (services/gateway/core/usage.py). Before, the close cancelled that
flush and found nothing left to write: the calls it had not written yet were lost."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from services.gateway.core import usage
from shared.db import SEARCH_PATH
from shared.repositories import keys as keys_repo
from tests.support import Stack, create_api_key


@pytest.mark.parametrize("slow", ["before the row is in", "after the row is in"])
async def test_closing_during_a_flush_counts_every_call_once(stack: Stack, monkeypatch: pytest.MonkeyPatch, slow: str) -> None:
    _, key_id = await create_api_key(stack.database_url, daily_limit=1000)
    writing = asyncio.Event()
    real_add_calls = keys_repo.add_calls

    async def slow_add_calls(conn: asyncpg.Connection, *args: Any) -> int:
        writing.set()
        if slow.startswith("before"):
            await asyncio.sleep(0.5)  # the INSERT is on its way
        total = await real_add_calls(conn, *args)
        if slow.startswith("after"):
            await asyncio.sleep(0.5)  # the row is in; its answer is on its way
        return total

    monkeypatch.setattr(keys_repo, "add_calls", slow_add_calls)
    monkeypatch.setattr(usage, "FLUSH_SECONDS", 0.0)
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2, server_settings={"search_path": SEARCH_PATH})
    redis = aioredis.Redis.from_url(stack.redis_url)
    calls = usage.DailyCalls(pool, redis, prefix=f"test:calls:{key_id}")
    try:
        for _ in range(3):
            await calls.count(key_id)
        await asyncio.wait_for(writing.wait(), 10)
        await calls.aclose()  # lands while the background flush waits for its answer
        async with pool.acquire() as conn:
            stored = await keys_repo.calls_on(conn, key_id, usage.utc_today())
    finally:
        await redis.aclose()
        await pool.close()
    assert stored == 3
