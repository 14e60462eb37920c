"""Recall's side-effects queue (services/recall/effects.py): a drain moves what is queued, up to
BATCH effects, from the shared list to its replica's processing list, applies them in one
transaction and drops them, oldest first; nothing is lost, nothing is left behind, and an
empty queue drains nothing. The queue lives in a Redis database of its own here, so the stack's
own recall replicas (which drain the same key in database 0) do not take these effects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.recall.effects import BATCH, QUEUE, SideEffects
from shared.db import create_pool
from shared.repositories import events as events_repo
from tests.support import Stack, unique

QUEUE_DB = 13  # a database nothing else on the stack's Redis uses


@pytest.fixture
async def queue_redis(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.redis_url.rpartition("/")[0] + f"/{QUEUE_DB}")
    await client.delete(QUEUE)
    yield client
    await client.delete(QUEUE)
    await client.aclose()


async def test_a_drain_takes_up_to_a_batch_oldest_first_and_loses_nothing(stack: Stack, queue_redis: Redis) -> None:
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            ids = [await events_repo.next_search_event_id(conn) for _ in range(BATCH + 7)]
        replica = unique("effects")
        effects = SideEffects(pool, queue_redis, replica=replica)
        marker = unique("drain")
        for event_id in ids:
            await effects.submit({"event": events_repo.search_event_row(
                event_id=event_id, key_id=None, session_id=None, query_type="text", query_text=marker, keywords=None,
                filters={}, result_ids=[], search_path="L2", latency_ms=1.0,
            )})
        assert await queue_redis.llen(QUEUE) == BATCH + 7

        async def landed() -> list[int]:
            async with pool.acquire() as conn:
                rows = await conn.fetch("SELECT id FROM search_events WHERE query_text = $1 ORDER BY id", marker)
            return [r["id"] for r in rows]

        processing = f"{QUEUE}:processing:{replica}"
        assert await effects.drain_once(wait=0) == BATCH
        assert await landed() == ids[:BATCH]  # the first submitted first
        assert await queue_redis.llen(QUEUE) == 7
        assert await queue_redis.llen(processing) == 0

        assert await effects.drain_once(wait=0) == 7
        assert await landed() == ids
        assert await queue_redis.llen(QUEUE) == 0
        assert await queue_redis.llen(processing) == 0

        assert await effects.drain_once(wait=0) == 0
        assert await landed() == ids
    finally:
        await pool.close()
