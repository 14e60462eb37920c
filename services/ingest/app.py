"""Ingest service: the write path. create_app + lifespan own every client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from redis.asyncio import Redis

from services.common.heap import settle_heap
from services.ingest.api import router, tool_handlers
from services.ingest.service import WriteResources
from services.common.internal import install_internal_api
from shared.db import create_pool
from shared.embeddings import load_embedder
from shared.jobs import celery_client
from shared.settings import IngestSettings
from shared.telemetry import configure_logging, configure_tracing


def create_app(settings: IngestSettings | None = None) -> FastAPI:
    settings = settings or IngestSettings()
    configure_logging(settings.log_level)
    configure_tracing(settings.otel_service_name or "engram-ingest", console=settings.otel_console)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(settings.database_url, min_size=settings.db_pool_min, max_size=settings.db_pool_max)
        embedder = await anyio.to_thread.run_sync(load_embedder)
        # The batch queue and the feedback-sampling limits; no connection is made until used.
        redis = Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=5) if settings.redis_active else None
        app.state.settings = settings
        app.state.resources = WriteResources(pool=pool, embedder=embedder, settings=settings, redis=redis)
        app.state.celery = celery_client(settings.broker_url or settings.redis_url) if settings.redis_active else None
        settle_heap()
        try:
            yield
        finally:
            if redis is not None:
                await redis.aclose()
            await pool.close()

    app = FastAPI(title="engram-ingest", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(router)
    install_internal_api(app, "ingest", tool_handlers, lambda: settings.service_token)
    return app
