"""The memory REST API of reference 001 against the session stack: HTTP clients per tenant,
and, for the model passes, a second ingest and gateway on the same database whose LLM is an
OpenAI-compatible fake answering at its HTTP boundary."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import asyncpg
import httpx
import pytest

from services.stack.supervisor import ServiceProcess, Stack, free_port
from shared.db import SEARCH_PATH
from tests.support import create_api_key, unique

API = "/api/v1/memory"


@dataclass
class Tenant:
    key: str
    key_id: str | None
    client: httpx.AsyncClient

    async def namespace(self, name: str | None = None, description: str = "") -> dict[str, Any]:
        reply = await self.client.post(f"{API}/namespaces", json={"name": name or unique("ns"), "description": description})
        assert reply.status_code == 201, reply.text
        return reply.json()

    async def entry(self, ns: str, content: str, source: str = "manual", **fields: Any) -> dict[str, Any]:
        reply = await self.client.post(f"{API}/namespaces/{ns}/entries", json={"content": content, "source": source, **fields})
        assert reply.status_code == 201, reply.text
        return reply.json()


def client(url: str, key: str | None, *, bearer: bool = False) -> httpx.AsyncClient:
    headers = {} if key is None else ({"Authorization": f"Bearer {key}"} if bearer else {"X-API-Key": key})
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(600.0))


@pytest.fixture
async def tenant(stack: Stack) -> AsyncIterator[Tenant]:
    """A fresh API key (read + write) of its own tenant."""
    key, key_id = await create_api_key(stack.database_url)
    async with client(stack.gateway_url, key) as http:
        yield Tenant(key, key_id, http)


@pytest.fixture
async def other_tenant(stack: Stack) -> AsyncIterator[Tenant]:
    key, key_id = await create_api_key(stack.database_url)
    async with client(stack.gateway_url, key, bearer=True) as http:
        yield Tenant(key, key_id, http)


@pytest.fixture
async def master(stack: Stack) -> AsyncIterator[Tenant]:
    async with client(stack.gateway_url, stack.master_key) as http:
        yield Tenant(stack.master_key, None, http)


@pytest.fixture
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        yield conn
    finally:
        await conn.close()


@dataclass
class FakeLLM:
    """Chat completions: facts for an extraction prompt, one merged sentence for a
    consolidation prompt, OK otherwise. Records every request."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    facts: str = "The user prefers pnpm over npm.\nThe deploy target is Kubernetes."
    merged: str = "The staging database is Postgres 18 on port 5433."
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.requests.append({"path": self.path, "body": body, "auth": self.headers.get("authorization")})
                system = body["messages"][0]["content"]
                answer = fake.facts if "extract" in system else fake.merged if "merge" in system else "OK"
                reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()


def _wait_healthy(proc: ServiceProcess, url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{proc.name} not healthy; see {proc.log_path}")
        time.sleep(0.3)


@pytest.fixture(scope="package")
def fake_llm() -> Iterator[FakeLLM]:
    llm = FakeLLM()
    llm.start()
    yield llm
    llm.stop()


@pytest.fixture(scope="package")
def llm_gateway(stack: Stack, fake_llm: FakeLLM) -> Iterator[str]:
    """An ingest whose LLM is the fake, and a gateway (OpenAPI on) forwarding writes to it;
    same database and recall as the stack. Returns the gateway's URL."""
    ingest_port, gateway_port = free_port(), free_port()
    ingest = stack._uvicorn(
        "ingest-llm", "services.ingest.app", ingest_port,
        {"LLM_BASE_URL": fake_llm.url, "LLM_API_KEY": "fake-key", "LLM_MODEL": "fake-model", "GEMINI_TIMEOUT_MS": "5000"},
    )
    ingest.start()
    _wait_healthy(ingest, f"http://127.0.0.1:{ingest_port}")
    gateway = stack._uvicorn(
        "gateway-llm", "services.gateway.app", gateway_port,
        {"MEMENTO_ACCESS_KEY": stack.master_key, "RECALL_URL": ",".join(stack.recall_urls),
         "INGEST_URL": f"http://127.0.0.1:{ingest_port}", "ENABLE_OPENAPI": "true"},
    )
    gateway.start()
    try:
        _wait_healthy(gateway, f"http://127.0.0.1:{gateway_port}")
        yield f"http://127.0.0.1:{gateway_port}"
    finally:
        gateway.stop()
        ingest.stop()
