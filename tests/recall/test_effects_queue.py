"""Recall's side-effects queue (services/recall/effects.py). A drain moves what is queued, up to
BATCH effects, from the shared list to its replica's processing list, applies them in one
transaction and drops them, oldest first; nothing is lost and nothing is left behind. A replica
that died with a batch in its processing list has that batch applied by another replica's
drainer: found in the list of replicas at any heartbeat, or unlisted (a replica of an earlier
version) by the first heartbeat's scan; a live replica's batch is left to it. The queue lives in a Redis database of its own here, so the
stack's own recall replicas (which drain the same keys in database 0) do not take these effects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from services.recall.effects import ALIVE, BATCH, QUEUE, REPLICAS, SideEffects
from shared.db import create_pool
from shared.repositories import events as events_repo
from tests.support import Stack, unique, wait_for

QUEUE_DB = 13  # a database nothing else on the stack's Redis uses


@pytest.fixture
async def queue_redis(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.redis_url.rpartition("/")[0] + f"/{QUEUE_DB}")
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


@pytest.fixture
async def pool(stack: Stack) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(stack.database_url, min_size=1, max_size=2)
    yield pool
    await pool.close()


async def _events(pool: asyncpg.Pool, marker: str, count: int) -> list[dict[str, Any]]:
    """`count` recall effects, each a search event whose query text is `marker`."""
    async with pool.acquire() as conn:
        ids = [await events_repo.next_search_event_id(conn) for _ in range(count)]
    return [{"event": events_repo.search_event_row(
        event_id=event_id, key_id=None, session_id=None, query_type="text", query_text=marker, keywords=None,
        filters={}, result_ids=[], search_path="L2", latency_ms=1.0,
    )} for event_id in ids]


async def _landed(pool: asyncpg.Pool, marker: str) -> list[int]:
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT id FROM search_events WHERE query_text = $1 ORDER BY id", marker)
    return [r["id"] for r in rows]


async def _landed_all(pool: asyncpg.Pool, marker: str, expected: list[int]) -> bool:
    return await _landed(pool, marker) == expected


async def test_a_drain_takes_up_to_a_batch_oldest_first_and_loses_nothing(pool: asyncpg.Pool, queue_redis: Redis) -> None:
    marker = unique("drain")
    queued = await _events(pool, marker, BATCH + 7)
    ids = [e["event"]["id"] for e in queued]
    replica = unique("effects")
    effects = SideEffects(pool, queue_redis, replica=replica)
    for effect in queued:
        await effects.submit(effect)
    assert await queue_redis.llen(QUEUE) == BATCH + 7

    processing = f"{QUEUE}:processing:{replica}"
    assert await effects.drain_once(wait=0) == BATCH
    assert await _landed(pool, marker) == ids[:BATCH]  # the first submitted first
    assert await queue_redis.llen(QUEUE) == 7
    assert await queue_redis.llen(processing) == 0

    assert await effects.drain_once(wait=0) == 7
    assert await _landed(pool, marker) == ids
    assert await queue_redis.llen(QUEUE) == 0
    assert await queue_redis.llen(processing) == 0

    assert await effects.drain_once(wait=0) == 0
    assert await _landed(pool, marker) == ids


async def test_a_dead_replicas_batch_is_applied_by_another_and_a_live_ones_is_left(
    pool: asyncpg.Pool, queue_redis: Redis,
) -> None:
    listed, unlisted, alive = unique("dead-listed"), unique("dead-unlisted"), unique("alive")
    marker, alive_marker = unique("adopt"), unique("kept")
    left = {listed: await _events(pool, marker, 3), unlisted: await _events(pool, marker, 2),
            alive: await _events(pool, alive_marker, 2)}
    for owner, effects_left in left.items():
        await queue_redis.lpush(f"{QUEUE}:processing:{owner}", *[json.dumps(e) for e in effects_left])
    await queue_redis.sadd(REPLICAS, listed, alive)  # `unlisted` ran a version that kept no list
    await queue_redis.set(ALIVE.format(replica=alive), "1", ex=60)

    live = unique("live")
    effects = SideEffects(pool, queue_redis, replica=live)
    drainer = asyncio.create_task(effects.run())
    try:
        expected = sorted(e["event"]["id"] for owner in (listed, unlisted) for e in left[owner])
        assert await wait_for(lambda: _landed_all(pool, marker, expected)), "the dead replicas' effects were not applied"
        # One that lists itself and dies later is found by a later heartbeat (the list, no scan).
        later, later_marker = unique("dead-later"), unique("later")
        left[later] = await _events(pool, later_marker, 2)
        await queue_redis.lpush(f"{QUEUE}:processing:{later}", *[json.dumps(e) for e in left[later]])
        await queue_redis.sadd(REPLICAS, later)
        expected_later = [e["event"]["id"] for e in left[later]]
        assert await wait_for(lambda: _landed_all(pool, later_marker, expected_later), timeout=60), "a later death was missed"
    finally:
        await effects.stop()
        await asyncio.wait_for(drainer, 30)

    assert await queue_redis.llen(f"{QUEUE}:processing:{listed}") == 0
    assert await queue_redis.llen(f"{QUEUE}:processing:{unlisted}") == 0
    assert await queue_redis.llen(f"{QUEUE}:processing:{later}") == 0
    assert await queue_redis.llen(f"{QUEUE}:processing:{alive}") == 2
    assert await _landed(pool, alive_marker) == []
    replicas = {m.decode() for m in await queue_redis.smembers(REPLICAS)}
    assert replicas == {alive, live}
