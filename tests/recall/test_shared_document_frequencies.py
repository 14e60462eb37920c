"""Document frequencies shared by the recall replicas through Redis (services/recall/search.py,
DocumentFrequencies): a replica that starts counts nothing another replica counted, a tenant
never reads another tenant's counts, a count that reached DF_CAP is kept longer, and with
Redis away the counts are taken from Postgres as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from services.recall.search import DF_KEY, DF_SATURATED_TTL_S, DF_TTL_S, DocumentFrequencies, df_scope
from services.stack.supervisor import free_port
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.redis_breaker import request_path_redis
from shared.repositories import retrieval
from shared.settings import RecallSettings
from tests.support import Stack, call, create_api_key, mcp_session, unique

# Tenant A's fragments: "orders" in three, "database" in two, "backup" in one.
A_TEXTS = [
    "The orders database backup runs every night at two.",
    "Restoring the orders database takes about forty minutes.",
    "The orders queue drains before noon on Fridays.",
]
# Tenant B's, in a workspace of the same name: "orders" once, no "database".
B_TEXTS = ["The orders page shows the newest first."]


async def _tenant(stack: Stack, ws: str, texts: list[str]) -> tuple[str, Principal]:
    key, key_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, key) as s:
        for text in texts:
            assert (await call(s, "remember", {"content": text, "topic": "ops", "type": "fact", "workspace": ws}))["success"]
    return key, Principal(key_id=key_id, visible_key_ids=(key_id,))


@pytest.fixture
async def scene(stack: Stack) -> tuple[str, str, Principal, Principal]:
    ws = unique()
    a_key, a = await _tenant(stack, ws, A_TEXTS)
    _, b = await _tenant(stack, ws, B_TEXTS)
    return ws, a_key, a, b


@pytest.fixture
async def redis(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The terms each count in Postgres was asked for."""
    asked: list[list[str]] = []
    count = retrieval.document_frequencies

    async def recorded(conn: Any, principal: Principal, flt: FragmentFilter, terms: list[str]) -> dict[str, int]:
        asked.append(list(terms))
        return await count(conn, principal, flt, terms)

    monkeypatch.setattr(retrieval, "document_frequencies", recorded)
    return asked


async def _lookup(stack: Stack, dfs: DocumentFrequencies, principal: Principal, ws: str, text: str) -> dict[str, int]:
    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            terms = await retrieval.query_terms(conn, text, [])
            found = await dfs.lookup(conn, principal, FragmentFilter(workspace=ws), terms)
        await dfs.settled()  # what was counted is in Redis (shared after the lookup returns)
        return found
    finally:
        await pool.close()


QUERY = "orders database backup"
A_COUNTS = {"order": 3, "databas": 2, "backup": 1}


async def test_a_replica_that_starts_counts_nothing_another_replica_counted(
    stack: Stack, scene: tuple[str, str, Principal, Principal], redis: Redis, counted: list[list[str]]
) -> None:
    ws, _, a, _ = scene
    assert await _lookup(stack, DocumentFrequencies(redis), a, ws, QUERY) == A_COUNTS
    assert sorted(counted[0]) == sorted(A_COUNTS)
    # A second replica, started afterwards: the counts come from Redis, none from Postgres.
    assert await _lookup(stack, DocumentFrequencies(redis), a, ws, QUERY) == A_COUNTS
    assert len(counted) == 1
    # Without Redis a new process counts again (what the spy sees when counting happens).
    assert await _lookup(stack, DocumentFrequencies(), a, ws, QUERY) == A_COUNTS
    assert len(counted) == 2


async def test_a_tenant_never_reads_another_tenants_counts(
    stack: Stack, scene: tuple[str, str, Principal, Principal], redis: Redis, counted: list[list[str]]
) -> None:
    ws, _, a, b = scene
    shared = DocumentFrequencies(redis)
    assert await _lookup(stack, shared, a, ws, QUERY) == A_COUNTS
    # The same terms, the same workspace name, another tenant: counted in B's own fragments.
    assert await _lookup(stack, shared, b, ws, QUERY) == {"order": 1, "databas": 0, "backup": 0}
    assert await _lookup(stack, DocumentFrequencies(redis), b, ws, QUERY) == {"order": 1, "databas": 0, "backup": 0}
    assert len(counted) == 2
    assert df_scope(a, FragmentFilter(workspace=ws)) != df_scope(b, FragmentFilter(workspace=ws))


async def test_a_count_that_reached_the_cap_is_kept_longer(
    stack: Stack, scene: tuple[str, str, Principal, Principal], redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, _, a, _ = scene
    monkeypatch.setattr(retrieval, "DF_CAP", 2)  # "order" (3) and "databas" (2) reach it; "backup" (1) does not
    assert await _lookup(stack, DocumentFrequencies(redis), a, ws, QUERY) == {"order": 2, "databas": 2, "backup": 1}
    scope = df_scope(a, FragmentFilter(workspace=ws))
    ttls = {term: await redis.ttl(DF_KEY.format(scope=scope, term=term)) for term in A_COUNTS}
    assert DF_TTL_S < ttls["order"] <= DF_SATURATED_TTL_S
    assert DF_TTL_S < ttls["databas"] <= DF_SATURATED_TTL_S
    assert 0 < ttls["backup"] <= DF_TTL_S


async def test_with_redis_away_the_counts_are_taken_from_postgres(
    stack: Stack, scene: tuple[str, str, Principal, Principal], counted: list[list[str]]
) -> None:
    ws, _, a, _ = scene
    away = request_path_redis(f"redis://127.0.0.1:{free_port()}/0", RecallSettings(DATABASE_URL=stack.database_url))
    try:
        dfs = DocumentFrequencies(away)
        assert await _lookup(stack, dfs, a, ws, QUERY) == A_COUNTS
        assert await _lookup(stack, dfs, a, ws, QUERY) == A_COUNTS  # then from this process's cache
    finally:
        await away.aclose()
    assert len(counted) == 1


async def test_the_recall_service_shares_what_it_counts(
    stack: Stack, scene: tuple[str, str, Principal, Principal], redis: Redis
) -> None:
    ws, a_key, a, _ = scene
    async with mcp_session(stack.mcp_url, a_key) as s:
        reply = await call(s, "recall", {"text": "how long does restoring the orders database take", "workspace": ws})
    assert reply["fragments"]
    scope = df_scope(a, FragmentFilter(workspace=ws))
    # The service shares its counts after the reply: wait for them (up to 5 s), then check them.
    for _ in range(50):
        if await redis.exists(DF_KEY.format(scope=scope, term="databas")):
            break
        await asyncio.sleep(0.1)
    assert await redis.get(DF_KEY.format(scope=scope, term="databas")) == b"2"
    assert await redis.get(DF_KEY.format(scope=scope, term="order")) == b"3"
