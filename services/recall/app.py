"""Recall service: the read path. Stateless; run as many replicas as load needs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from services.common.internal import install_internal_api
from services.recall.api import router, tool_handlers
from services.recall.service import ReadResources
from shared.db import create_pool
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, model_dir
from shared.settings import RecallSettings
from shared.telemetry import configure_logging, configure_tracing


def create_app(settings: RecallSettings | None = None) -> FastAPI:
    settings = settings or RecallSettings()
    configure_logging(settings.log_level)
    configure_tracing(settings.otel_service_name or "engram-recall", console=settings.otel_console)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Filtered vector search keeps scanning the HNSW graph until enough rows pass the
        # filters (pgvector 0.8 iterative scan) instead of returning a short top k.
        pool = await create_pool(
            settings.database_url,
            min_size=settings.db_pool_min,
            max_size=settings.db_pool_max,
            session_sql=f"SET hnsw.iterative_scan = relaxed_order; SET hnsw.ef_search = {int(settings.hnsw_ef_search)}",
        )
        embedder = await anyio.to_thread.run_sync(load_embedder)
        tokens = TokenCounter(model_dir() / "tokenizer.json")
        app.state.settings = settings
        app.state.resources = ReadResources(pool=pool, embedder=embedder, tokens=tokens)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="engram-recall", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(router)
    install_internal_api(app, "recall", tool_handlers, lambda: settings.service_token)
    return app

