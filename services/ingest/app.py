"""Ingest service: the write path. create_app + lifespan own every client."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from services.common.heap import settle_heap
from services.common.internal import NATIVE_TELEMETRY_OFF, install_internal_api
from services.ingest.api import router, tool_handlers
from services.ingest.memory_import import router as memory_import_router
from services.ingest.service import INLINE_JOBS, WriteResources
from shared import background, memory_events
from shared.db import create_pool
from shared.embeddings import load_embedder
from shared.job_relay import OutboxRelay
from shared.jobs import broker_key, celery_client, send_outbox_jobs
from shared.redis_breaker import request_path_redis
from shared.repositories import vector_search
from shared.settings import IngestSettings
from shared.telemetry import configure_telemetry


def create_app(settings: IngestSettings | None = None) -> FastAPI:
    settings = settings or IngestSettings()
    settings.check_secure()
    configure_telemetry(settings, "engram-ingest")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(
            settings.database_url, min_size=settings.db_pool_min, max_size=settings.db_pool_max,
            server_settings={**memory_events.recording_settings(settings), **vector_search.graph_settings(settings.hnsw_ef_search)},
        )
        embedder = await anyio.to_thread.run_sync(load_embedder)
        # The batch queue, the recall cache's generations and the feedback-sampling limits;
        # no connection is made until used, and a Redis outage costs a request ~nothing.
        redis = request_path_redis(settings.redis_url, settings) if settings.redis_active else None
        broker_url = settings.broker_url or settings.redis_url
        celery = celery_client(broker_url) if settings.redis_active else None
        relay = None
        if celery is not None:
            relay = OutboxRelay(
                pool, broker_key(broker_url), functools.partial(send_outbox_jobs, celery),
                poll=settings.outbox_poll_interval.total_seconds(), backoff_max=settings.outbox_backoff_max.total_seconds(),
                inline=INLINE_JOBS, linger=settings.outbox_linger.total_seconds(),
            )
        app.state.settings = settings
        app.state.resources = WriteResources(pool=pool, embedder=embedder, settings=settings, redis=redis, relay=relay)
        app.state.celery = celery
        relaying = asyncio.create_task(relay.run()) if relay is not None else None
        # memory:* events recorded by every write (migration 0017) go to the Redis stream.
        publishing = asyncio.create_task(memory_events.MemoryEventRelay(
            pool, memory_events.EventLog(redis, settings), settings,
            poll=settings.outbox_poll_interval.total_seconds(), backoff_max=settings.outbox_backoff_max.total_seconds(),
        ).run()) if redis is not None else None
        settle_heap()
        try:
            yield
        finally:
            await background.stop(relaying, publishing)
            if redis is not None:
                await redis.aclose()
            await pool.close()

    app = FastAPI(title="engram-ingest", lifespan=lifespan, docs_url=None, redoc_url=None, telemetry=NATIVE_TELEMETRY_OFF)
    app.include_router(router)
    app.include_router(memory_import_router)  # reference 001's streamed POST /memory/import
    install_internal_api(app, "ingest", tool_handlers, lambda: settings.service_token)
    return app
