"""An MCP client session on a running stack (mcp SDK, Streamable HTTP, Bearer auth), shared
by the tests and the benchmarks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def mcp_session(
    # The HTTP client's per-request timeout, not a deadline for the session (callers that want
    # one wrap it in asyncio.timeout).
    url: str, key: str, headers: dict[str, str] | None = None, timeout: float = 60  # noqa: ASYNC109
) -> AsyncIterator[ClientSession]:
    all_headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with (
        httpx2.AsyncClient(headers=all_headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def payload(result: Any) -> dict[str, Any]:
    """A tool result's JSON: structuredContent, else the first text content."""
    if getattr(result, "structured_content", None) is not None:
        return result.structured_content
    return json.loads(result.content[0].text)
