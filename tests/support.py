"""Test helpers: real MCP clients against a real stack."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from services.stack.supervisor import Stack, StackConfig, free_port


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


def unique(prefix: str = "ws") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def mcp_session(url: str, key: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    all_headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with httpx2.AsyncClient(headers=all_headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def payload(result: Any) -> dict[str, Any]:
    """A tool result's JSON: structuredContent, else the first text content."""
    if getattr(result, "structured_content", None) is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    return payload(result)


__all__ = ["Stack", "StackConfig", "call", "mcp_session", "new_stack_config", "payload", "unique"]


async def create_api_key(database_url: str, name: str | None = None, **fields: Any) -> tuple[str, str]:
    """Create an API key straight in the database (tests of other areas need tenants before
    the admin API is involved). Returns (raw key, key id)."""
    import asyncpg

    from shared.db import SEARCH_PATH
    from shared.repositories import keys as keys_repo

    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        raw, row = await keys_repo.create_key(conn, name=name or unique("key"), **fields)
        return raw, row["id"]
    finally:
        await conn.close()
