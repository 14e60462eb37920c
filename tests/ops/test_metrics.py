"""Metrics that answer "which tool is slow, and why", scraped from a running stack: per-tool
latency at the gateway and in each service, errors by kind, pool saturation, embedding time
and batch sizes, the L1 hit ratio, queue depths; label sets bounded whatever callers send."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from services.common.internal import observe_dependencies
from services.common.rpc import SERVICE_TOKEN_HEADER
from services.recall import effects
from services.stack.supervisor import free_port
from shared.contract.catalog import TOOLS_BY_NAME
from shared.db import create_pool
from shared.jobs import QUEUE_BATCH, QUEUE_MAINTENANCE
from shared.metrics import DEAD_LETTER_KEY, QUEUE_KEYS, QueueDepthCollector, observe_pool
from shared.repositories.batch_jobs import BatchQueue
from shared.settings import CommonSettings
from tests.support import Stack, call, create_api_key, mcp_session, unique

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def label_values(samples: Samples, names: Iterable[str], label: str) -> set[str]:
    wanted = set(names)
    return {dict(labels)[label] for (name, labels) in samples if name in wanted and label in dict(labels)}


def service_urls(stack: Stack) -> dict[str, str]:
    return {"gateway": stack.gateway_url, "recall": stack.recall_urls[0], "ingest": stack.ingest_url}


async def test_unmatched_paths_and_unknown_tools_never_become_label_values(stack: Stack) -> None:
    marker = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=10) as http:
        for url in service_urls(stack).values():
            for n in range(5):
                assert (await http.get(f"{url}/probe-{marker}-{n}")).status_code == 404
        # An unknown tool at an internal service (its token accepted): the route's template.
        refused = await http.post(f"{stack.recall_urls[0]}/v1/tools/nope-{marker}", headers={SERVICE_TOKEN_HEADER: stack.service_token},
                                  json={"arguments": {}, "principal": {"is_master": True}})
        assert refused.status_code == 404
        # Refused at the front door before routing: labelled by the route it was for.
        assert (await http.post(f"{stack.gateway_url}/mcp", json={})).status_code == 401
    key, _ = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, key) as s:
        for n in range(3):
            with pytest.raises(Exception):  # noqa: B017 - -32602 Unknown tool
                await call(s, f"nope-{marker}-{n}", {})
        # A caller's free text (session_rotate's reason) is no label value either.
        rotated = await call(s, "session_rotate", {"reason": f"because-{marker}"})
        assert rotated["ok"] is True

    # Bounded: the MCP catalog, each service's own table of internal handlers (the REST
    # surfaces' and the admin views' operations), and "other".
    from services.ingest.api import tool_handlers as ingest_handlers
    from services.recall.api import tool_handlers as recall_handlers

    catalog = set(TOOLS_BY_NAME) | set(recall_handlers) | set(ingest_handlers) | {"other"}
    for service, url in service_urls(stack).items():
        samples = scrape(url)
        routes = label_values(samples, ("engram_http_requests_total", "engram_http_request_duration_seconds_count"), "route")
        assert "unmatched" in routes, (service, routes)
        assert not [r for r in routes if marker in r or r.startswith("/probe")], (service, routes)
        tools = label_values(samples, ("engram_tool_call_duration_seconds_count", "engram_tool_errors_total",
                                       "engram_tool_calls_total", "mcp_tool_calls_total"), "tool")
        assert tools <= catalog, (service, tools - catalog)
        everything = {v for (_name, labels) in samples for _k, v in labels}
        assert not [v for v in everything if marker in v], service
    gateway = scrape(stack.gateway_url)
    assert value(gateway, "engram_http_requests_total", service="gateway", route="/mcp", status="401") >= 1
    # Unknown tools are timed, as "other".
    assert value(gateway, "engram_tool_call_duration_seconds_count", service="gateway", tool="other") >= 3


async def test_metrics_say_which_tool_is_slow_and_why(stack: Stack) -> None:
    urls = service_urls(stack)
    before = {name: scrape(url) for name, url in urls.items()}
    key, _ = await create_api_key(stack.database_url)
    ws = unique("metrics")
    text = f"which region hosts the {unique('svc')} database"
    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"The {name} database is hosted in eu-west-1.", "topic": "ops", "type": "fact"} for name in ("orders", "users")]})
        for _ in range(2):  # the second is an L1 hit: nothing was written in between
            await call(s, "recall", {"text": text, "workspace": ws})
        with pytest.raises(Exception):  # noqa: B017 - -32602: recall needs a query
            await call(s, "recall", {"workspace": ws})
    after = {name: scrape(url) for name, url in urls.items()}

    def grew(target: str, name: str, **labels: str) -> float:
        return value(after[target], name, **labels) - value(before[target], name, **labels)

    # Per-tool latency where the agent waits and where the work is done.
    assert grew("gateway", "engram_tool_call_duration_seconds_count", service="gateway", tool="recall") == 3
    # (>=: the worker calls the services too, outside this test's calls)
    assert grew("recall", "engram_tool_call_duration_seconds_count", service="recall", tool="recall") >= 3
    assert grew("ingest", "engram_tool_call_duration_seconds_count", service="ingest", tool="batch_remember") >= 1
    # Errors by kind: the refused recall is the caller's (InvalidParams), at both hops.
    assert grew("recall", "engram_tool_errors_total", service="recall", tool="recall", kind="InvalidParams") >= 1
    assert grew("gateway", "engram_tool_errors_total", service="gateway", tool="recall", kind="InvalidParams") == 1
    # The L1 cache: one miss, then one hit.
    assert grew("recall", "engram_recall_l1_lookups_total", result="miss") >= 1
    assert grew("recall", "engram_recall_l1_lookups_total", result="hit") >= 1
    # Embedding: recall ran the model for the new query text; ingest embedded a batch of 2.
    assert grew("recall", "engram_embedding_duration_seconds_count") >= 1
    assert grew("ingest", "engram_embedding_batch_size_sum") >= 2
    for service in urls:
        samples = after[service]
        in_use = value(samples, "engram_db_pool_in_use", service=service)
        assert 0 <= in_use <= value(samples, "engram_db_pool_max", service=service)
        assert value(samples, "engram_db_pool_connections", service=service) >= 1
        assert ("engram_db_pool_waiting", frozenset({("service", service)})) in samples
        assert value(samples, "engram_dependency_up", service=service, dependency="postgres") == 1
        assert value(samples, "engram_dependency_up", service=service, dependency="redis") == 1


async def test_the_worker_reports_every_queue_depth(stack: Stack) -> None:
    # The names shared/metrics.py reads are the queues' own.
    queue = BatchQueue(Redis.from_url(stack.redis_url))  # registers its scripts lazily: no round trip
    assert QUEUE_KEYS["recall_effects"] == effects.QUEUE
    assert QUEUE_KEYS["celery_maintenance"] == QUEUE_MAINTENANCE and QUEUE_KEYS["celery_batch"] == QUEUE_BATCH
    assert (QUEUE_KEYS["batch_jobs"], QUEUE_KEYS["batch_processing"], DEAD_LETTER_KEY) == (queue.queue, queue.processing, queue.dead)
    samples = scrape(f"http://127.0.0.1:{stack.config.worker_metrics_port}")
    assert label_values(samples, ["engram_queue_depth"], "queue") == set(QUEUE_KEYS)
    assert ("engram_batch_dead_letters", frozenset()) in samples
    assert value(samples, "engram_dependency_up", service="worker", dependency="redis") == 1


def test_logs_are_json_in_production_and_traces_export_only_when_asked() -> None:
    assert CommonSettings(ENGRAM_ENV="production").effective_log_format == "json"
    assert CommonSettings(ENGRAM_ENV="dev").effective_log_format == "text"
    assert CommonSettings(ENGRAM_ENV="production", LOG_FORMAT="text").effective_log_format == "text"
    assert not CommonSettings().otlp_traces
    assert CommonSettings(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318").otlp_traces
    assert CommonSettings(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://collector:4318/v1/traces").otlp_traces
    assert CommonSettings(OTEL_TRACES_EXPORTER="otlp").otlp_traces
    assert not CommonSettings(OTEL_TRACES_EXPORTER="none", OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318").otlp_traces


async def test_pool_gauges_count_connections_lent_and_callers_waiting(stack: Stack) -> None:
    def gauges() -> tuple[float | None, float | None]:
        return tuple(REGISTRY.get_sample_value(name, {"service": "ops-test"})  # type: ignore[return-value]
                     for name in ("engram_db_pool_in_use", "engram_db_pool_waiting"))

    pool = await create_pool(stack.database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire():
            waiter = asyncio.create_task(pool.acquire(timeout=10).__aenter__())
            await asyncio.sleep(0.1)
            observe_pool("ops-test", pool)
            assert gauges() == (1, 1)
        await pool.release(await waiter)
        observe_pool("ops-test", pool)
        assert gauges() == (0, 0)
    finally:
        await pool.close()


@dataclass
class _Resources:
    pool: Any
    redis: Any


async def test_dependency_probes_tell_a_busy_pool_from_a_postgres_that_is_away(stack: Stack) -> None:
    def up(dependency: str) -> float | None:
        return REGISTRY.get_sample_value("engram_dependency_up", {"service": "ops-probe", "dependency": dependency})

    live = await create_pool(stack.database_url, min_size=1, max_size=1)
    dead = await create_pool(f"postgresql://postgres@127.0.0.1:{free_port()}/engram", min_size=0, max_size=1)
    redis_live, redis_dead = Redis.from_url(stack.redis_url), Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        await observe_dependencies("ops-probe", _Resources(live, redis_live))
        assert (up("postgres"), up("redis")) == (1, 1)
        async with live.acquire():  # every connection lent out: busy, not down
            await observe_dependencies("ops-probe", _Resources(live, redis_live))
        assert up("postgres") == 1
        await observe_dependencies("ops-probe", _Resources(dead, redis_dead))
        assert (up("postgres"), up("redis")) == (0, 0)
    finally:
        await live.close()
        await dead.close()
        await redis_live.aclose()
        await redis_dead.aclose()


async def test_celery_queues_are_read_on_the_broker_and_the_others_on_redis(stack: Stack) -> None:
    """A broker apart from REDIS_URL (CELERY_BROKER_URL): Celery's queues are counted there."""
    broker_url = stack.redis_url.rsplit("/", 1)[0] + "/15"  # a database nothing else on this Redis uses
    broker = Redis.from_url(broker_url)
    try:
        await broker.delete(QUEUE_MAINTENANCE)
        await broker.lpush(QUEUE_MAINTENANCE, "a", "b")
        families = {f.name: f for f in QueueDepthCollector(stack.redis_url, broker_url).collect()}
        depths = {s.labels["queue"]: s.value for s in families["engram_queue_depth"].samples}
        assert depths["celery_maintenance"] == 2 and set(depths) == set(QUEUE_KEYS)
        assert families["engram_dependency_up"].samples[0].value == 1
        # Redis away: no depths, and the worker says it did not reach Redis.
        away = list(QueueDepthCollector(f"redis://127.0.0.1:{free_port()}/0").collect())
        assert [f.name for f in away] == ["engram_dependency_up"] and away[0].samples[0].value == 0
    finally:
        await broker.delete(QUEUE_MAINTENANCE)
        await broker.aclose()
