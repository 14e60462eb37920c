"""Gateway tests: the shared stack, plus extra gateway processes (on the same database,
recall and ingest) where a test needs settings the default stack does not have."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from services.stack.supervisor import ServiceProcess, Stack, free_port


@dataclass
class Gateway:
    url: str
    log_path: Any
    master_key: str

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"


def _redis_db(url: str, db: int) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{db}"


def start_gateway(
    stack: Stack, name: str, redis_db: int, env: dict[str, str], *, require_healthy: bool = True
) -> tuple[ServiceProcess, Gateway]:
    """require_healthy=False: wait for /health to answer at all (a gateway given a dead recall
    or ingest answers 503 by design)."""
    port = free_port()
    proc = stack._uvicorn(  # noqa: SLF001 - the same launcher the stack uses
        name, "services.gateway.app", port,
        {
            "MEMENTO_ACCESS_KEY": stack.master_key,
            "RECALL_URL": ",".join(stack.recall_urls),
            "INGEST_URL": stack.ingest_url,
            # Its own Redis database: its rate-limit counters must not meet the main gateway's.
            "REDIS_URL": _redis_db(stack.redis_url, redis_db),
            **env,
        },
    )
    proc.start()
    deadline = time.monotonic() + 60
    while True:
        if not proc.alive():
            raise RuntimeError(f"{name} exited; see {proc.log_path}")
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
            if status == 200 or not require_healthy:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{name} not healthy")
        time.sleep(0.2)
    return proc, Gateway(f"http://127.0.0.1:{port}", proc.log_path, stack.master_key)


@pytest.fixture(scope="session")
def tuned_gateway(stack: Stack) -> Iterator[Gateway]:
    """OpenAPI on, one-second segment idle, a known Origin allow-list, generous limits."""
    proc, gateway = start_gateway(
        stack, "gateway-tuned", 2,
        {
            "ENABLE_OPENAPI": "true",
            "MEMENTO_SESSION_SEGMENT_IDLE": "PT1S",
            "ALLOWED_ORIGINS": "https://example.com,http://localhost:*,http://127.0.0.1:*",
            "MEMENTO_ROTATE_RATE_LIMIT_PER_MIN": "1000",
            # A broker database no worker reads, so tests can read the jobs it was sent.
            "CELERY_BROKER_URL": _redis_db(stack.redis_url, 3),
        },
    )
    yield gateway
    proc.stop()


@pytest.fixture(scope="session")
def limited_gateway(stack: Stack) -> Iterator[Gateway]:
    """Low per-IP, per-key and rotate limits; Streamable HTTP sessions expire after 3 idle seconds."""
    proc, gateway = start_gateway(
        stack, "gateway-limited", 1,
        {"RATE_LIMIT_PER_IP_PER_MIN": "8", "RATE_LIMIT_PER_KEY_PER_MIN": "6", "MEMENTO_ROTATE_RATE_LIMIT_PER_MIN": "3",
         "MEMENTO_SESSION_IDLE_TIMEOUT": "PT3S"},
    )
    yield gateway
    proc.stop()




@pytest.fixture(scope="session")
def replica_gateway(stack: Stack) -> Iterator[Gateway]:
    """A second replica of the stack's gateway: same database, same Redis database."""
    proc, gateway = start_gateway(stack, "gateway-replica", 0, {})
    yield gateway
    proc.stop()


@pytest.fixture(scope="session")
def redisless_gateway(stack: Stack) -> Iterator[Gateway]:
    """A gateway with REDIS_ENABLED=false: everything it keeps in Redis elsewhere works without."""
    proc, gateway = start_gateway(stack, "gateway-redisless", 4, {"REDIS_ENABLED": "false"})
    yield gateway
    proc.stop()
