"""A stack of maintenance's own for these tests: its own database (in the session's
Postgres) and its own Redis, so all-tenant cycles and beat jobs touch only data made here,
and the worker consumes only tasks sent here. Beat runs the reflect sweep every few
seconds; an OpenAI-compatible fake LLM answers at its HTTP boundary."""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from services.stack.supervisor import free_port
from shared.db import SEARCH_PATH
from shared.jobs import celery_client
from tests import support
from tests.support import Stack, new_stack_config


@dataclass
class FakeLLM:
    """Chat completions: CONTRADICT for contradiction checks, YES/NO for injection checks,
    a fixed narrative otherwise."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    narrative: str = "LLM narrative: the session chose the retry policy and fixed the flaky deploy."
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.requests.append({"path": self.path, "body": body, "auth": self.headers.get("authorization")})
                system = body["messages"][0]["content"]
                if "CONTRADICT" in system:
                    answer = "CONTRADICT"
                elif "prompt injection" in system:
                    answer = "YES" if "instructions" in body["messages"][1]["content"] else "NO"
                else:
                    answer = fake.narrative
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


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="package")
def fake_llm() -> Iterator[FakeLLM]:
    llm = FakeLLM()
    llm.start()
    yield llm
    llm.stop()


@pytest.fixture(scope="package")
def mstack(stack: Stack, stack_dir: Path, fake_llm: FakeLLM) -> Iterator[Stack]:
    name = f"engram_maint_{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        conn = await asyncpg.connect(stack.database_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    config = new_stack_config(stack_dir / "maintenance", database_url=_with_database(stack.database_url, name),
                              master_key="maint-master-key")
    # Outside the session's temp dir, so worker.log / beat.log outlive a failed run.
    config.log_dir = Path(tempfile.gettempdir()) / "engram-maintenance-logs" / name
    config.extra_env.update({
        "EMBEDDING_CACHE_DIR": str(stack.model_cache),
        "WORKER_METRICS_PORT": str(free_port()),
        "REFLECT_SWEEP_INTERVAL": "PT3S",
        "LLM_BASE_URL": fake_llm.url,
        "LLM_API_KEY": "fake-key",
        "LLM_MODEL": "fake-model",
        "GEMINI_TIMEOUT_MS": "5000",
    })
    with Stack(config) as own:
        yield own


@pytest.fixture(scope="package")
def metrics_port(mstack: Stack) -> int:
    return int(mstack.config.extra_env["WORKER_METRICS_PORT"])


@pytest.fixture
async def db(mstack: Stack) -> Any:
    conn = await asyncpg.connect(mstack.database_url, server_settings={"search_path": SEARCH_PATH})
    from pgvector.asyncpg import register_vector

    await register_vector(conn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture(scope="package")
def embedder(stack: Stack) -> Any:
    import os

    os.environ.setdefault("EMBEDDING_CACHE_DIR", str(stack.model_cache))
    from shared.embeddings import load_embedder

    return load_embedder()


@pytest.fixture(scope="package")
def producer(mstack: Stack) -> Any:
    return celery_client(mstack.redis_url)


# Maintenance jobs go through the broker and the worker: longer than the default wait.
wait_for = functools.partial(support.wait_for, timeout=90.0, interval=0.25)
