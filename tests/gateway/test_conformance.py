"""The applicable scenarios of the official MCP conformance suite
(@modelcontextprotocol/conformance, installed by `make test-clients`).

The suite speaks to an unauthenticated server; a small proxy in this test adds the master
key's Bearer to every request and streams replies back unchanged."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from services.stack.supervisor import free_port
from tests.gateway.test_third_party_clients import CLIENTS, NODE_BIN
from tests.support import Stack

CONFORMANCE = CLIENTS / "inspector" / "node_modules" / ".bin" / "conformance"
# Scenarios that fit a memory server: the others need the suite's own fixture tools
# (images, audio, sampling, elicitation, test_* prompts and resources).
# dns-rebinding-protection checks Host/Origin refusal; server-sse-multiple-streams checks
# concurrent POSTs of one session (answered as JSON, which the suite accepts).
SCENARIOS = ("server-initialize", "ping", "tools-list", "prompts-list", "resources-list",
             "dns-rebinding-protection", "server-sse-multiple-streams")
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


def bearer_proxy(target: str, key: str) -> Starlette:
    client = httpx.AsyncClient(timeout=None)

    async def forward(request: Request) -> StreamingResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["authorization"] = f"Bearer {key}"
        upstream = await client.send(
            client.build_request(request.method, f"{target}{request.url.path}", params=request.query_params,
                                 headers=headers, content=await request.body()),
            stream=True,
        )

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(body(), status_code=upstream.status_code, headers=reply_headers)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE"])])


@pytest.fixture
async def proxied(stack: Stack) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(bearer_proxy(stack.gateway_url, stack.master_key), host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    await task


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_conformance_scenario(proxied: str, scenario: str) -> None:
    if not CONFORMANCE.exists():
        pytest.skip("conformance suite not installed: run `make test-clients`")
    env = dict(os.environ)
    env["PATH"] = f"{NODE_BIN}:{env.get('PATH', '')}"
    done = await asyncio.to_thread(
        subprocess.run, [str(CONFORMANCE), "server", "--url", proxied, "--scenario", scenario],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
