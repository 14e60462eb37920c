"""Helpers of the mnemory REST surface's tests (reference 004): an HTTP client for a key."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


def api(base_url: str, key: str | None = None, *, header: str = "x-api-key", agent: str | None = None) -> httpx.AsyncClient:
    headers: dict[str, str] = {}
    if key is not None:
        headers = {"Authorization": f"Bearer {key}"} if header == "bearer" else {"X-API-Key": key}
    if agent:
        headers["X-Agent-Id"] = agent
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120)


async def add(client: httpx.AsyncClient, content: str, **fields: Any) -> str:
    reply = await client.post("/api/memories", json={"content": content, **fields})
    assert reply.status_code == 200, reply.text
    result = reply.json()["results"][0]
    return str(result["id"])


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 120, interval: float = 0.5) -> Any:  # noqa: ASYNC109
    """The first truthy value of check(), polling until `timeout` seconds pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last: {value!r})")
        await asyncio.sleep(interval)


async def set_layer(database_url: str, memory_id: str, layer: str) -> None:
    """Mark a memory raw or consolidated, as /api/remember's job and a consolidation do."""
    import asyncpg

    from shared.db import SEARCH_PATH

    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        await conn.execute("UPDATE mnemory_memories SET memory_layer = $2 WHERE fragment_id = $1", memory_id, layer)
    finally:
        await conn.close()
