"""Concurrent searches on a small connection pool: none of them waits forever.

A search holds its main connection and borrows one or two more while it runs (the vector
layer beside the lexical one, the whole question's best cosine). Admitted without a bound,
as many searches as the pool has connections each took one and waited for a second that
none would give back: at 1M fragments 30 concurrent filtered recalls left the replica
answering nothing, ever (bench/README.md, session 29). Here the pool is two connections, so
two concurrent searches were enough."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from services.common.internal import ToolContext
from services.recall.effects import SideEffects
from services.recall.service import SHED_MARGIN_S, ReadResources, recall, search_slots
from shared.db import create_pool
from shared.domain.errors import Unavailable
from shared.domain.principal import Principal
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, tokenizer_file
from shared.repositories import vector_search
from shared.settings import RecallSettings
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique

CONCURRENT = 8
# A hang detector, not a timing: the old code never finished at all.
DEADLINE_S = 120.0
API = "/api/v1/memory"


@pytest.fixture(scope="module")
async def small_pool(stack: Stack, stack_dir: Path) -> AsyncIterator[Stack]:
    config = new_stack_config(
        stack_dir / "small-pool", database_url=stack.database_url, redis_url=stack.redis_url,
        worker=False, beat=False, master_key=stack.master_key,
    )
    config.extra_env.update({"DB_POOL_MAX": "2"})
    async with running(config) as own:
        yield own


async def test_concurrent_recalls_on_a_two_connection_pool_all_answer(small_pool: Stack) -> None:
    ws = unique()
    facts = [f"The {name} service deploys from the {branch} branch on Tuesdays." for name, branch in
             (("billing", "release"), ("search", "main"), ("gateway", "stable"), ("ingest", "trunk"))]
    async with mcp_session(small_pool.mcp_url, small_pool.master_key) as s:
        for fact in facts:
            await call(s, "remember", {"content": fact, "topic": "deploys", "type": "fact", "workspace": ws})

    async def one(i: int) -> dict:
        # Each client its own session, as concurrent agents are; text and a filter so that
        # the vector layer borrows its connection and the lexical layer runs on the main one.
        async with mcp_session(small_pool.mcp_url, small_pool.master_key) as s:
            return await call(s, "recall", {"text": f"which branch does the {('billing', 'search')[i % 2]} service deploy from",
                                            "workspace": ws, "type": "fact", "minImportance": 0.1})

    found = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CONCURRENT))), DEADLINE_S)
    assert len(found) == CONCURRENT
    for i, reply in enumerate(found):
        assert reply["fragments"], reply
        assert ("billing", "search")[i % 2] in reply["fragments"][0]["content"]
    # And the replica still answers afterwards, and says how many searches it runs at once.
    async with mcp_session(small_pool.mcp_url, small_pool.master_key) as s:
        again = await asyncio.wait_for(call(s, "recall", {"text": "gateway stable branch", "workspace": ws}), DEADLINE_S)
    assert "gateway" in again["fragments"][0]["content"]
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{small_pool.recall_urls[0]}/metrics")).text
    assert 'engram_recall_search_slots{service="recall"} 1.0' in metrics.splitlines()
    assert 'engram_recall_searches_waiting{service="recall"} 0.0' in metrics.splitlines()


async def test_concurrent_entry_searches_on_a_two_connection_pool_all_answer(small_pool: Stack) -> None:
    """The reference REST surface's relevance search runs the same layered search."""
    key, _ = await create_api_key(small_pool.database_url)
    async with httpx.AsyncClient(base_url=small_pool.gateway_url, headers={"X-API-Key": key}, timeout=DEADLINE_S) as http:
        ns = (await http.post(f"{API}/namespaces", json={"name": unique("ns"), "description": ""})).json()["id"]
        for content in ("Prefer pnpm over npm in this repository.", "Releases are cut on Thursdays."):
            assert (await http.post(f"{API}/namespaces/{ns}/entries", json={"content": content, "source": "manual"})).status_code == 201
        replies = await asyncio.wait_for(
            asyncio.gather(*(http.get(f"{API}/entries", params={"q": "pnpm"}) for _ in range(CONCURRENT))), DEADLINE_S,
        )
    for reply in replies:
        assert reply.status_code == 200, reply.text
        assert reply.json()[0]["content"].startswith("Prefer pnpm")


@asynccontextmanager
async def in_process(stack: Stack, fact: str, pool_max: int) -> AsyncIterator[tuple[ReadResources, str]]:
    """recall's resources in this process on a pool of its own (`pool_max` connections, all
    open), and the fresh workspace `fact` was stored in."""
    ws = unique()
    async with mcp_session(stack.mcp_url, stack.master_key) as s:
        await call(s, "remember", {"content": fact, "topic": "deploys", "type": "fact", "workspace": ws})
    pool = await create_pool(stack.database_url, min_size=pool_max, max_size=pool_max,
                             server_settings=vector_search.graph_settings(40))
    try:
        yield ReadResources(pool=pool, embedder=load_embedder(latency=True), tokens=TokenCounter(tokenizer_file()),
                            settings=RecallSettings(), effects=SideEffects(pool, None, replica="test")), ws
    finally:
        await pool.close()


async def test_a_one_connection_pool_searches_on_its_one_connection(stack: Stack) -> None:
    """DB_POOL_MAX=1: nothing to borrow, so the layers run one after the other on the main
    connection instead of waiting for a second one (the old code waited forever)."""
    async with in_process(stack, "The billing service deploys from the release branch.", 1) as (res, ws):
        assert res.lender is None and search_slots(1) == 1
        reply, _ = await asyncio.wait_for(
            recall(res, ToolContext(principal=Principal.master()), {"text": "which branch does billing deploy from", "workspace": ws}),
            DEADLINE_S,
        )
    assert "release branch" in reply["fragments"][0]["content"]


def waiting() -> float | None:
    return REGISTRY.get_sample_value("engram_recall_searches_waiting", {"service": "recall"})


async def test_a_search_waits_for_a_slot_holding_no_connection(stack: Stack) -> None:
    async with in_process(stack, "The search service deploys from the main branch.", 2) as (res, ws):
        async with res.search_slot():  # the one slot of a two-connection pool
            task = asyncio.ensure_future(recall(res, ToolContext(principal=Principal.master()), {"text": "search branch", "workspace": ws}))
            for _ in range(200):
                if waiting() == 1:
                    break
                await asyncio.sleep(0.01)
            assert waiting() == 1 and not task.done()
            assert res.pool.get_idle_size() == res.pool.get_size() == 2  # it waits holding no connection
        reply, _ = await asyncio.wait_for(task, DEADLINE_S)
        assert waiting() == 0
    assert "main branch" in reply["fragments"][0]["content"]


def shed() -> float:
    return REGISTRY.get_sample_value("engram_recall_searches_shed_total", {"service": "recall"}) or 0.0


async def test_a_search_whose_slot_does_not_come_before_its_deadline_is_shed(stack: Stack) -> None:
    """A waiting search is shed (Unavailable: the gateway's 503 with Retry-After) once its
    slot has not come SHED_MARGIN_S before its caller's deadline, instead of running later for a
    caller who gave up; it leaves no slot, connection or waiter behind. A free slot is taken
    whatever the deadline."""
    async with in_process(stack, "The ingest service deploys from the trunk branch.", 2) as (res, ws):
        loop = asyncio.get_running_loop()
        args = {"text": "ingest branch", "workspace": ws}
        before = shed()
        async with res.search_slot():  # the one slot of a two-connection pool
            ctx = ToolContext(principal=Principal.master(), deadline=loop.time() + SHED_MARGIN_S + 0.2)
            with pytest.raises(Unavailable, match="no search slot came before the caller's deadline"):
                await asyncio.wait_for(recall(res, ctx, args), DEADLINE_S)
            assert waiting() == 0 and shed() == before + 1
            assert res.pool.get_idle_size() == res.pool.get_size() == 2
        # The slot is free again: taken at once, even by a search whose deadline has passed.
        late = ToolContext(principal=Principal.master(), deadline=loop.time() - 10)
        reply, _ = await asyncio.wait_for(recall(res, late, args), DEADLINE_S)
        assert "trunk branch" in reply["fragments"][0]["content"]
        assert shed() == before + 1 and res.searches.locked() is False


def test_searches_hold_at_most_half_the_pool() -> None:
    # Half the pool as main connections leaves one to borrow at every size from two up.
    for pool_max in range(2, 40):
        assert 1 <= search_slots(pool_max) <= pool_max - 1
