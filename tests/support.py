"""Test helpers: real MCP clients against a real stack."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pgvector.asyncpg import register_vector

from services.gateway.core.limits import WINDOW_SECONDS
from services.stack.client import mcp_session, payload
from services.stack.supervisor import Stack, StackConfig, free_port
from shared.db import SEARCH_PATH
from shared.schema.migrate import migration_files

T = TypeVar("T")


def new_stack_config(data_dir: Path, **overrides: Any) -> StackConfig:
    config = StackConfig(
        data_dir=data_dir,
        gateway_port=free_port(),
        recall_ports=[free_port()],
        ingest_port=free_port(),
        pg_port=free_port(),
        redis_port=free_port(),
        worker_metrics_port=free_port(),
        redis_url=os.environ.get("REDIS_URL") or None,
        extra_env={"ENGRAM_ENV": "test", "LOG_LEVEL": "INFO"},
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@asynccontextmanager
async def running(config: StackConfig) -> AsyncIterator[Stack]:
    """A stack of its own for an async test or fixture: started and stopped off the event loop."""
    stack = Stack(config)
    await asyncio.to_thread(stack.__enter__)
    try:
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


async def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.2) -> Any:  # noqa: ASYNC109
    """Await predicate() until it returns something truthy or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


async def in_one_window(run: Callable[[], Awaitable[T]], tries: int = 3) -> T:
    """run()'s result from a run that started and ended in one of the rate limits' fixed
    windows (services/gateway/core/limits.py): a run that crosses a window's end may be let
    through twice the limit, so it is repeated (run() must count against fresh keys each time)."""
    for _ in range(tries):
        started = int(time.time() // WINDOW_SECONDS)
        result = await run()
        if int(time.time() // WINDOW_SECONDS) == started:
            return result
    raise AssertionError(f"each of {tries} runs crossed a rate-limit window's end")


def unique(prefix: str = "ws") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def call(session: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    return payload(result)


__all__ = ["Stack", "StackConfig", "call", "mcp_session", "new_stack_config", "payload", "unique", "wait_for"]


async def create_api_key(database_url: str, name: str | None = None, **fields: Any) -> tuple[str, str]:
    """Create an API key straight in the database (tests of other areas need tenants before
    the admin API is involved). Returns (raw key, key id)."""
    from shared.repositories import keys as keys_repo

    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        raw, row = await keys_repo.create_key(conn, name=name or unique("key"), **fields)
        return raw, row["id"]
    finally:
        await conn.close()


async def facts_beside_another_tenant(mcp_url: str, database_url: str, ws: str, texts: list[str]) -> tuple[str, list[str], str]:
    """A new key stores `texts` as facts in `ws`; a second key stores a copy of the first
    there too (what isolation must keep out). Returns (key id, its fragment ids, the copy's id)."""
    key, key_id = await create_api_key(database_url)
    other, _ = await create_api_key(database_url)
    async with mcp_session(mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": t, "topic": "ops", "type": "fact"} for t in texts]})
    async with mcp_session(mcp_url, other) as s:
        copy = await call(s, "remember", {"content": texts[0], "topic": "ops", "type": "fact", "workspace": ws})
    return key_id, [r["id"] for r in reply["results"]], copy["id"]


@asynccontextmanager
async def migrated_before(database_url: str, migration: str) -> AsyncIterator[tuple[asyncpg.Connection, list[tuple[str, str]]]]:
    """A connection to a new database with every migration before `migration` applied (the
    pgvector codec registered), and the migrations from `migration` on, in order, for the test
    to apply once it has written its store. The database is dropped after."""
    files = migration_files()
    assert migration in dict(files)
    name = f"engram_migration_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
        conn = await asyncpg.connect(url, server_settings={"search_path": SEARCH_PATH})
        try:
            for file, sql in files:
                if file < migration:
                    await conn.execute(sql)
            await register_vector(conn)
            yield conn, [(file, sql) for file, sql in files if file >= migration]
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()
