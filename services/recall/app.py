"""Recall service: the read path. Stateless; run as many replicas as load needs."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from services.common.heap import settle_heap
from services.common.internal import NATIVE_TELEMETRY_OFF, install_internal_api
from services.recall.api import router, tool_handlers
from services.recall.effects import SideEffects
from services.recall.memory_api import router as memory_export_router
from services.recall.routing import route_reads
from services.recall.search import DocumentFrequencies
from services.recall.service import ReadResources
from shared import background
from shared.db import create_pool
from shared.domain.keywords import korean_morphemes
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, tokenizer_file
from shared.read_routing import ReadRouter
from shared.redis_breaker import request_path_redis
from shared.repositories import vector_search
from shared.settings import RecallSettings
from shared.telemetry import configure_telemetry


def create_app(settings: RecallSettings | None = None) -> FastAPI:
    settings = settings or RecallSettings()
    settings.check_secure()
    configure_telemetry(settings, "engram-recall")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Filtered vector search keeps scanning the HNSW graph until enough rows pass the
        # filters (pgvector 0.8 iterative scan) instead of returning a short top k.
        graph = vector_search.graph_settings(settings.hnsw_ef_search)
        pool = await create_pool(
            settings.database_url,
            min_size=settings.db_pool_min,
            max_size=settings.db_pool_max,
            server_settings=graph,
        )
        embedder = await anyio.to_thread.run_sync(functools.partial(load_embedder, latency=True))
        # Load the Korean analyser now rather than on the first Korean query (~2 s).
        await anyio.to_thread.run_sync(korean_morphemes, "한국어")
        tokens = TokenCounter(tokenizer_file())
        redis = request_path_redis(settings.redis_url, settings) if settings.redis_active else None
        # Pod name (k8s) or host, plus port (several replicas on one dev host).
        effects = SideEffects(pool, redis, replica=f"{socket.gethostname()}-{settings.port}")
        # Reads on DATABASE_REPLICA_URLS when set (services/recall/routing.py); the effects
        # above write, so they keep the primary pool.
        read_router = await ReadRouter.open(pool, settings, redis, graph)
        app.state.settings = settings
        app.state.read_router = read_router
        app.state.resources = ReadResources(
            pool=read_router.pool, embedder=embedder, tokens=tokens, settings=settings, effects=effects, redis=redis,
            df_cache=DocumentFrequencies(redis),
        )
        drainer = asyncio.create_task(effects.run())
        checker = asyncio.create_task(read_router.run()) if read_router.enabled else None
        settle_heap()
        try:
            yield
        finally:
            await effects.stop()
            await background.stop(drainer, checker)
            await read_router.close()
            if redis is not None:
                await redis.aclose()
            await pool.close()

    app = FastAPI(title="engram-recall", lifespan=lifespan, docs_url=None, redoc_url=None, telemetry=NATIVE_TELEMETRY_OFF)
    app.include_router(router)
    app.include_router(memory_export_router)  # reference 001's streamed GET /memory/export
    install_internal_api(app, "recall", route_reads(tool_handlers), lambda: settings.service_token)
    return app
