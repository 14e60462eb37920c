"""Helpers of the ingest tests: database reads and waiting on the async queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
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
