"""Helpers for gateway tests: a hand-driven MCP client for asserting on the wire, DB access."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx

from services.stack.supervisor import Stack
from shared.db import SEARCH_PATH


@asynccontextmanager
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        yield conn
    finally:
        await conn.close()


INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rpc_body(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a Streamable HTTP reply (JSON or one SSE event)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if "id" in message:
                return message
    raise AssertionError(f"no JSON-RPC reply in {response.text!r}")


class RawMcp:
    """A hand-driven Streamable HTTP client, for asserting on the wire."""

    def __init__(self, http: httpx.AsyncClient, url: str, key: str, headers: dict[str, str] | None = None) -> None:
        self.http = http
        self.url = url
        self.headers = {**ACCEPT, "Authorization": f"Bearer {key}", **(headers or {})}
        self.session_id: str | None = None
        self._id = 1

    async def initialize(self, params: dict[str, Any] | None = None, session_id: str | None = None) -> httpx.Response:
        body = {**INIT, "params": {**INIT["params"], **(params or {})}}
        headers = dict(self.headers)
        if session_id:
            headers["mcp-session-id"] = session_id
        response = await self.http.post(self.url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        self.session_id = response.headers["mcp-session-id"]
        await self.http.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self._headers())
        return response

    def _headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.session_id:
            headers["mcp-session-id"] = self.session_id
        headers["mcp-protocol-version"] = "2025-06-18"
        return headers

    async def request(self, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
        self._id += 1
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self._id, "method": method}
        if params is not None:
            body["params"] = params
        return await self.http.post(self.url, json=body, headers={**self._headers(), **(headers or {})})

    async def rpc(self, method: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
        response = await self.request(method, params, headers)
        assert response.status_code == 200, response.text
        return rpc_body(response)

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.rpc("tools/call", {"name": name, "arguments": arguments})

    async def delete(self) -> httpx.Response:
        return await self.http.delete(self.url, headers=self._headers())


