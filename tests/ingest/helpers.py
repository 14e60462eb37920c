"""Helpers of the ingest tests: database reads and waiting on the async queue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from shared.db import SEARCH_PATH
from tests.support import call


@asynccontextmanager
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        yield conn
    finally:
        await conn.close()


async def fragment(database_url: str, fragment_id: str) -> asyncpg.Record | None:
    async with db(database_url) as conn:
        return await conn.fetchrow("SELECT * FROM fragments WHERE id = $1", fragment_id)


async def rpc_error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> Any:
    """The JSON-RPC error a call raises (fails the test if it does not)."""
    try:
        result = await session.call_tool(tool, arguments)
    except MCPError as exc:
        return exc.error
    raise AssertionError(f"{tool} did not fail: {result}")


async def tool_error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool-level error reply (isError true) and its payload."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error is True, result
    return result.structured_content


async def wait_job(session: ClientSession, job_id: str, states: tuple[str, ...] = ("completed", "dead"), timeout: float = 120) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await call(session, "batch_status", {"jobId": job_id})
        if status.get("state") in states or loop.time() > deadline:
            return status
        await asyncio.sleep(0.3)


async def principal_of(database_url: str, raw_key: str) -> dict[str, Any]:
    from shared.repositories import keys as keys_repo

    async with db(database_url) as conn:
        principal = await keys_repo.principal_for_raw_key(conn, raw_key)
    assert principal is not None
    return principal.to_wire()


async def ingest_call(stack: Any, principal: dict[str, Any], tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call on ingest's internal API, as the gateway or the batch worker makes it."""
    import httpx

    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(
            f"{stack.ingest_url}/v1/tools/{tool}",
            json={"arguments": arguments, "principal": principal, "session": None},
            headers={"x-engram-service-token": stack.service_token},
        )
    return response.json()


async def remember_while_key_locked(stack: Any, raw_key: str, key_id: str, content: str) -> tuple[bool, dict[str, Any]]:
    """A remember on ingest while a test transaction holds the key's api_keys row FOR NO KEY
    UPDATE: that blocks remember's SELECT ... FOR UPDATE, not the fragment insert's foreign
    key check (FOR KEY SHARE). Returns (whether the remember was seen waiting on that lock, its reply once the
    lock is released)."""
    principal = await principal_of(stack.database_url, raw_key)
    async with db(stack.database_url) as holder, db(stack.database_url) as watcher:
        lock = holder.transaction()
        await lock.start()
        await holder.execute("SELECT 1 FROM api_keys WHERE id = $1 FOR NO KEY UPDATE", key_id)
        task = asyncio.create_task(ingest_call(stack, principal, "remember", {"content": content, "topic": "quota", "type": "fact"}))
        waited = False
        try:
            while not task.done():
                blocked = await watcher.fetchval(
                    "SELECT count(*) FROM pg_locks l JOIN pg_locks h ON h.locktype = l.locktype"
                    " AND h.database IS NOT DISTINCT FROM l.database AND h.relation IS NOT DISTINCT FROM l.relation"
                    " AND h.page IS NOT DISTINCT FROM l.page AND h.tuple IS NOT DISTINCT FROM l.tuple"
                    " AND h.transactionid IS NOT DISTINCT FROM l.transactionid"
                    " WHERE NOT l.granted AND h.granted AND h.pid = $1",
                    holder.get_server_pid(),
                )
                if blocked:
                    waited = True
                    break
                await asyncio.sleep(0.02)
        finally:
            await lock.rollback()
        reply = await task
    return waited, reply.get("result", reply)


# -- admin export / import through the gateway -----------------------------------------
ADMIN_PREFIX = "/v1/internal/model/nothing"


def admin_auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def export(stack: Any, key: str, **params: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("GET", f"{stack.gateway_url}{ADMIN_PREFIX}/export", params=params, headers=admin_auth(key)) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("application/x-ndjson")
            return [json.loads(line) async for line in response.aiter_lines() if line]


async def import_(stack: Any, key: str, body: Any, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.post(f"{stack.gateway_url}{ADMIN_PREFIX}/import", params=params, headers=admin_auth(key),
                               content=json.dumps(body))
