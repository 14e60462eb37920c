"""POST /api/recall (reference 004): a second call in one memory session returns only memories
the client does not have yet; score_threshold and labels narrow the results; a session lives
in Redis with the documented idle TTL, so it continues on another gateway replica and after a
gateway restart; a session belongs to its key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from services.stack.supervisor import ServiceProcess
from tests.gateway.conftest import Gateway, _redis_db, start_gateway
from tests.mnemory_api.helpers import add, api
from tests.support import Stack, create_api_key, unique

# A Redis database of their own for the replicas of this module (others use 0-5).
SESSIONS_REDIS_DB = 7
DEFAULT_TTL = 24 * 3600  # MEMORY_SESSION_TTL's default


@pytest.fixture(scope="module")
def replicas(stack: Stack) -> Iterator[list[tuple[ServiceProcess, Gateway]]]:
    started = [start_gateway(stack, f"gateway-mnemory-{name}", SESSIONS_REDIS_DB, {}) for name in ("a", "b")]
    yield started
    for proc, _ in started:
        proc.stop()


async def test_second_recall_returns_only_new_memories(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as c:
        pinned = await add(c, "User's dog is a border collie named Pixel", memory_type="fact", pinned=True, categories=["personal"])
        walk = await add(c, "User walks the dog along the river every evening", memory_type="fact")
        first = (await c.post("/api/recall", json={
            "session_id": None, "query": "What do I know about the user's dog?", "include_instructions": True, "managed": True,
        })).json()
        session_id = first["session_id"]
        assert session_id.startswith("ses_") and first["instructions"]
        assert "border collie named Pixel" in first["core_memories"]
        # What core memories carry is known already: search results never repeat it.
        assert pinned not in [r["id"] for r in first["search_results"]]
        assert first["stats"]["core_count"] >= 1

        again = (await c.post("/api/recall", json={"session_id": session_id, "query": "What do I know about the user's dog?"})).json()
        assert again["session_id"] == session_id and again["core_memories"] is None and again["instructions"] is None
        assert again["search_results"] == [] and again["stats"]["new_count"] == 0
        assert again["stats"]["known_skipped"] == again["stats"]["search_count"] >= 1

        vet = await add(c, "User's dog had its vaccination at the vet last week", memory_type="episodic")
        third = (await c.post("/api/recall", json={
            "session_id": session_id, "messages": [{"role": "user", "content": "When did the dog see the vet?"}]})).json()
        assert [r["id"] for r in third["search_results"]] == [vet]
        assert walk not in [r["id"] for r in third["search_results"]]

        strict = (await c.post("/api/recall", json={"query": "What do I know about the user's dog?", "score_threshold": 0.99})).json()
        assert strict["search_results"] == [] and strict["session_id"] != session_id

        lost = (await c.post("/api/recall", json={"session_id": "ses_unknown", "query": "dog"})).json()
        assert lost["session_id"] not in ("ses_unknown", session_id) and lost["core_memories"]  # a new session, a first call


async def test_labels_filter_and_a_session_belongs_to_its_key(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    marker = unique("p")
    async with api(stack.gateway_url, key) as c, api(stack.gateway_url, other) as o:
        a = await add(c, "The build server for project alpha runs on Debian", memory_type="fact", labels={"project": f"{marker}-a"})
        b = await add(c, "The build server for project beta runs on Alpine", memory_type="fact", labels={"project": f"{marker}-b"})
        only_b = (await c.post("/api/recall", json={"query": "which OS does the build server run", "labels": {"project": f"{marker}-b"}})).json()
        assert [r["id"] for r in only_b["search_results"]] == [b] and a not in (only_b["core_memories"] or "")
        mine = (await c.post("/api/recall", json={"query": "which OS does the build server run"})).json()
        assert {a, b} <= {r["id"] for r in mine["search_results"]}
        # Another key naming this session gets a session of its own, and none of the memories.
        theirs = (await o.post("/api/recall", json={"session_id": mine["session_id"], "query": "which OS does the build server run"})).json()
        assert theirs["session_id"] != mine["session_id"] and theirs["search_results"] == []


async def test_session_continues_on_another_replica_and_after_a_restart(
    stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]
) -> None:
    key, _ = await create_api_key(stack.database_url)
    (proc_a, gw_a), (_, gw_b) = replicas
    query = {"query": "What instrument does the user play?"}
    async with api(gw_a.url, key) as a:
        cello = await add(a, "User plays the cello in a community orchestra", memory_type="fact")
        first = (await a.post("/api/recall", json=query)).json()
    session_id = first["session_id"]
    assert cello in [r["id"] for r in first["search_results"]]
    redis = aioredis.from_url(_redis_db(stack.redis_url, SESSIONS_REDIS_DB))
    try:
        ttl = await redis.ttl(f"engram:mnemory:session:{session_id}")
        assert DEFAULT_TTL - 120 < ttl <= DEFAULT_TTL  # MEMORY_SESSION_TTL: 24 h by default
        async with api(gw_b.url, key) as b:
            on_b = (await b.post("/api/recall", json={"session_id": session_id, **query})).json()
        assert on_b["session_id"] == session_id and on_b["search_results"] == [] and on_b["stats"]["known_skipped"] >= 1

        await redis.expire(f"engram:mnemory:session:{session_id}", 100)  # as if idle almost a day
        proc_a.stop()
        proc_a.start()  # the same replica, restarted: nothing of the session was in its process
        restarted = Gateway(gw_a.url, gw_a.log_path, gw_a.master_key)
        async with api(restarted.url, key) as a2:
            await _wait_healthy(a2)
            piano = await add(a2, "User also plays the piano at home on weekends", memory_type="fact")
            after = (await a2.post("/api/recall", json={"session_id": session_id, **query})).json()
        assert after["session_id"] == session_id and [r["id"] for r in after["search_results"]] == [piano]
        # The call prolonged the idle timer back to the full TTL, the known-id set's too.
        assert await redis.ttl(f"engram:mnemory:session:{session_id}") > DEFAULT_TTL - 120
        assert await redis.ttl(f"engram:mnemory:session:{session_id}:known") > DEFAULT_TTL - 120
    finally:
        await redis.aclose()


async def test_without_redis_sessions_live_in_the_gateway_process(stack: Stack) -> None:
    proc, gateway = start_gateway(stack, "gateway-mnemory-redisless", 10, {"REDIS_ENABLED": "false"})
    try:
        key, _ = await create_api_key(stack.database_url)
        async with api(gateway.url, key) as c:
            bike = await add(c, "User commutes by bike across the old town bridge", memory_type="fact")
            first = (await c.post("/api/recall", json={"query": "How does the user commute across town?"})).json()
            assert [r["id"] for r in first["search_results"]] == [bike]
            again = (await c.post("/api/recall", json={"session_id": first["session_id"], "query": "How does the user commute across town?"})).json()
            assert again["session_id"] == first["session_id"] and again["search_results"] == []
    finally:
        proc.stop()


async def test_recall_degrades_to_an_empty_answer_when_recall_is_down(stack: Stack) -> None:
    """reference 004: find fails -> search -> core only -> empty response; never an error."""
    from services.stack.supervisor import free_port

    proc, gateway = start_gateway(stack, "gateway-mnemory-norecall", 11, {"RECALL_URL": f"http://127.0.0.1:{free_port()}"},
                                  require_healthy=False)
    try:
        key, _ = await create_api_key(stack.database_url)
        async with api(gateway.url, key) as c:
            reply = await c.post("/api/recall", json={"query": "anything about the user?", "include_instructions": True})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["session_id"].startswith("ses_") and body["instructions"]
            assert body["core_memories"] is None and body["search_results"] == [] and body["stats"]["search_count"] == 0
            assert (await c.post("/api/memories/search", json={"query": "x"})).status_code == 503  # the plain endpoint says so
    finally:
        proc.stop()


async def _wait_healthy(client: object) -> None:
    import asyncio

    import httpx

    assert isinstance(client, httpx.AsyncClient)
    for _ in range(300):
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("restarted gateway never became healthy")
