"""The Prometheus series that answer "which tool is slow, and why", in one place.

Every label set is bounded by code, never by a request: tools by the catalog (anything else is
"other"), errors by exception class, routes by the route table (services/common/internal.py),
queues by the names below. deploy/prometheus/rules.yml and deploy/grafana/engram.json are built
on exactly these series; tests/ops checks each one is in a real scrape.

Queue depths and the dependencies' health are read when Prometheus scrapes (a collector, or
the /metrics handler setting a gauge), so they cost the request path nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis import Redis
from redis.exceptions import RedisError

from shared.contract.catalog import TOOLS_BY_NAME
from shared.domain.errors import EngramError
from shared.jobs import QUEUE_BATCH, QUEUE_MAINTENANCE
from shared.repositories.batch_jobs import DEFAULT_PREFIX as BATCH_PREFIX

logger = logging.getLogger(__name__)

OTHER = "other"

# Tool latency from 2 ms (an L1 hit) to 10 s (a batch of 200 with embeddings on 2 cores).
TOOL_SECONDS = Histogram(
    "engram_tool_call_duration_seconds", "Tool call latency, per service and tool", ["service", "tool"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10),
)
TOOL_ERRORS = Counter(
    "engram_tool_errors_total", "Tool calls that failed, per service, tool and kind (error class; internal = unexpected)",
    ["service", "tool", "kind"],
)
# Error kinds that are the server's fault (the error-rate alert); the rest are the caller's.
SERVER_ERROR_KINDS = ("Unavailable", "UpstreamError", "internal")

EMBED_SECONDS = Histogram(
    "engram_embedding_duration_seconds", "Time of one embedding model run (a query, or a batch of texts)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
EMBED_BATCH = Histogram(
    "engram_embedding_batch_size", "Texts per embedding call", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
L1_LOOKUPS = Counter("engram_recall_l1_lookups_total", "Recall L1 cache lookups by result", ["result"])
SEARCH_SLOTS = Gauge("engram_recall_search_slots", "Searches a recall process runs at once (half its Postgres pool)", ["service"])
SEARCHES_WAITING = Gauge("engram_recall_searches_waiting", "Searches waiting for a slot, holding no connection", ["service"])
SEARCHES_SHED = Counter(
    "engram_recall_searches_shed_total", "Searches answered 503 because no slot came before their caller's deadline", ["service"],
)

DB_POOL_SIZE = Gauge("engram_db_pool_connections", "Postgres pool connections open", ["service"])
DB_POOL_IN_USE = Gauge("engram_db_pool_in_use", "Postgres pool connections lent out", ["service"])
DB_POOL_WAITING = Gauge("engram_db_pool_waiting", "Callers waiting for a Postgres pool connection", ["service"])
DB_POOL_MAX = Gauge("engram_db_pool_max", "Postgres pool size limit", ["service"])
DEPENDENCY_UP = Gauge("engram_dependency_up", "1 when this process reached the dependency at scrape time", ["service", "dependency"])

# Redis lists whose length is a backlog. Celery's queues are kombu lists named after the queue
# (on the broker); the batch queue is shared/repositories/batch_jobs.py's and recall's effects
# queue services/recall/effects.py's QUEUE (on REDIS_URL; tests/ops/test_metrics.py checks the names).
CELERY_QUEUE_KEYS: dict[str, str] = {f"celery_{QUEUE_MAINTENANCE}": QUEUE_MAINTENANCE, f"celery_{QUEUE_BATCH}": QUEUE_BATCH}
QUEUE_KEYS: dict[str, str] = {
    **CELERY_QUEUE_KEYS,
    "batch_jobs": f"{BATCH_PREFIX}:queue",
    "batch_processing": f"{BATCH_PREFIX}:processing",
    "recall_effects": "engram:recall:effects",
}
DEAD_LETTER_KEY = f"{BATCH_PREFIX}:dead"
# A scrape must answer within Prometheus' timeout (10 s default) even with Redis hung.
SCRAPE_REDIS_TIMEOUT_S = 1.0


def tool_label(name: str) -> str:
    """A tool name as a label: the catalog's names, anything else "other"."""
    return name if name in TOOLS_BY_NAME else OTHER


def tool_timers(service: str) -> dict[str, Any]:
    """The histogram child of every catalog tool (and "other") for one service, made once:
    a call then costs one dict lookup and one observe."""
    return {name: TOOL_SECONDS.labels(service, name) for name in (*TOOLS_BY_NAME, OTHER)}


def error_kind(exc: BaseException) -> str:
    """Bounded: our error classes by name, anything unexpected "internal"."""
    return type(exc).__name__ if isinstance(exc, EngramError) else "internal"


def count_error(service: str, tool: str, exc: BaseException) -> None:
    TOOL_ERRORS.labels(service, tool_label(tool), error_kind(exc)).inc()


def observe_pool(service: str, pool: Any) -> None:
    """An asyncpg pool's saturation, set when Prometheus scrapes. asyncpg has no public
    count of waiters: they are the getters of its free-connection queue (cancelled ones
    remove themselves)."""
    size, idle = pool.get_size(), pool.get_idle_size()
    DB_POOL_SIZE.labels(service).set(size)
    DB_POOL_IN_USE.labels(service).set(size - idle)
    DB_POOL_MAX.labels(service).set(pool.get_max_size())
    DB_POOL_WAITING.labels(service).set(len(getattr(getattr(pool, "_queue", None), "_getters", ()) or ()))


class MeasuredEmbedder:
    """An embedder whose every run is timed and whose batch sizes are counted; everything
    else (the backend's own attributes) is the wrapped embedder's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def inner(self) -> Any:
        """The backend's own embedder (its class says which backend runs)."""
        return self._inner

    def embed(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        try:
            return self._inner.embed(texts)
        finally:
            EMBED_SECONDS.observe(time.perf_counter() - started)
            EMBED_BATCH.observe(len(texts))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class QueueDepthCollector(Collector):
    """Backlogs in Redis, read at scrape time: Celery's queues, the batch queue, recall's
    effects queue, and the batch queue's dead letters. Registered by the worker's /metrics
    (one process per deployment reads them; several workers report the same values: use max)."""

    def __init__(self, redis_url: str, broker_url: str | None = None) -> None:
        self._redis = self._client(redis_url)
        self._broker = self._client(broker_url) if broker_url and broker_url != redis_url else self._redis

    @staticmethod
    def _client(url: str) -> Redis:
        return Redis.from_url(url, socket_timeout=SCRAPE_REDIS_TIMEOUT_S, socket_connect_timeout=SCRAPE_REDIS_TIMEOUT_S)

    @staticmethod
    def _lengths(client: Redis, keys: list[str]) -> list[int]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return [int(n) for n in pipe.execute()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily("engram_queue_depth", "Items waiting in a Redis-backed queue", labels=["queue"])
        dead = GaugeMetricFamily("engram_batch_dead_letters", "batch_remember jobs that failed every attempt")
        up = GaugeMetricFamily("engram_dependency_up", "1 when this process reached the dependency at scrape time",
                               labels=["service", "dependency"])
        own = {name: key for name, key in QUEUE_KEYS.items() if name not in CELERY_QUEUE_KEYS}
        try:
            celery = self._lengths(self._broker, list(CELERY_QUEUE_KEYS.values()))
            *queues, dead_letters = self._lengths(self._redis, [*own.values(), DEAD_LETTER_KEY])
        except (RedisError, OSError):
            logger.warning("queue depths unavailable: Redis did not answer the scrape")
            up.add_metric(["worker", "redis"], 0)
            yield up
            return
        for name, length in zip([*CELERY_QUEUE_KEYS, *own], [*celery, *queues], strict=True):
            depth.add_metric([name], length)
        dead.add_metric([], dead_letters)
        up.add_metric(["worker", "redis"], 1)
        yield depth
        yield dead
        yield up
