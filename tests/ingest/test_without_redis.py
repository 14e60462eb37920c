"""Without Redis: async batch_remember falls back to the synchronous path and batch_status
answers status null (seed). A real ingest app in this process, on the shared database."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import httpx
import pytest

from services.ingest import app as ingest_app
from services.ingest.app import create_app
from shared.domain.principal import Principal
from shared.settings import IngestSettings, embedding_settings
from tests.ingest.helpers import db
from tests.support import Stack, unique

TOKEN = "in-process-token"


@pytest.fixture(scope="module")
async def ingest_without_redis(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    # The model the stack already exported; nothing is exported twice.
    os.environ["EMBEDDING_CACHE_DIR"] = str(stack.model_cache)
    embedding_settings.cache_clear()
    settings = IngestSettings(DATABASE_URL=stack.database_url, REDIS_ENABLED=False, ENGRAM_SERVICE_TOKEN=TOKEN, ENGRAM_ENV="test")
    # Not the process-wide tracer provider and instrumentation: in the test process they would make
    # every later MCP client start traces of its own (the SDK propagates them in `_meta`), and the
    # trace tests, which send their own traceparent, would see another trace id.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ingest_app, "configure_telemetry", lambda *args, **kwargs: None)
        app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ingest") as client:
            yield client


async def _call(client: httpx.AsyncClient, tool: str, arguments: dict) -> dict:
    response = await client.post(f"/v1/tools/{tool}", headers={"x-engram-service-token": TOKEN},
                                 json={"arguments": arguments, "principal": Principal.master().to_wire(), "session": None})
    assert response.status_code == 200, response.text
    return response.json()


async def test_async_falls_back_to_synchronous(stack: Stack, ingest_without_redis: httpx.AsyncClient) -> None:
    ws = unique()
    items = [{"content": f"Fallback note {i}: the archive job keeps {i} snapshots.", "topic": "archive", "type": "fact"} for i in range(3)]
    reply = await _call(ingest_without_redis, "batch_remember", {"fragments": items, "workspace": ws, "async": True})
    assert reply["isError"] is False
    result = reply["result"]
    assert "jobId" not in result and result["inserted"] == 3 and [r["index"] for r in result["results"]] == [0, 1, 2]
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE workspace = $1 AND embedding IS NOT NULL", ws) == 3
    status = await _call(ingest_without_redis, "batch_status", {"jobId": "batch-1750000000000-a1b2c3d4"})
    assert status["result"] == {"jobId": "batch-1750000000000-a1b2c3d4", "status": None}
