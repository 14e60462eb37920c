"""Per-process clients of a Celery worker, created after fork (worker_process_init)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
from celery.signals import worker_process_init, worker_process_shutdown

from shared.db import create_pool
from shared.embeddings import Embedder, load_embedder
from shared.llm import LLMClient, load_llm
from shared.memory_events import recording_settings
from shared.repositories import vector_search
from shared.settings import MaintenanceSettings
from shared.telemetry import configure_telemetry

logger = logging.getLogger(__name__)
T = TypeVar("T")


class WorkerRuntime:
    """One event loop, one asyncpg pool, one LLM client and (on first use) one embedding
    model per worker process."""

    def __init__(self, settings: MaintenanceSettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.pool: asyncpg.Pool = self.loop.run_until_complete(
            # memory:* events of what a cycle changes are recorded by migration 0017's triggers.
            create_pool(
                settings.database_url, min_size=1, max_size=4,
                server_settings={**recording_settings(settings), **vector_search.graph_settings(settings.hnsw_ef_search)},
            )
        )
        self.llm: LLMClient = load_llm()
        self._embedder: Embedder | None = None

    def embedder(self) -> Embedder:
        """Loaded lazily: only embedding backfill needs the model (~90 MB, ~1 s to load)."""
        if self._embedder is None:
            self._embedder = load_embedder()
        return self._embedder

    def run(self, fn: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
        return self.loop.run_until_complete(fn(self.pool))

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()


_runtime: dict[str, WorkerRuntime] = {}


def runtime() -> WorkerRuntime:
    if "current" not in _runtime:  # solo pool / eager runs: no fork signal was sent
        _runtime["current"] = WorkerRuntime(MaintenanceSettings())
    return _runtime["current"]


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    settings = MaintenanceSettings()
    configure_telemetry(settings, "engram-maintenance")
    _runtime["current"] = WorkerRuntime(settings)


@worker_process_shutdown.connect
def _shutdown_process(**_: Any) -> None:
    current = _runtime.pop("current", None)
    if current is not None:
        current.close()
