"""One trace per tool call, exported over OTLP/HTTP to a real receiver the test runs:
gateway HTTP server span -> tools/call -> the internal hop's client span -> the recall /
ingest server span (once) -> its Postgres and Redis calls -> the Celery task it sends.
The services' JSON log lines carry the same trace id and the caller's correlation id."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.ops.otlp import OtlpReceiver, Span
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique

CID = "cid-ops-trace-test"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
async def traced_stack(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> AsyncIterator[Stack]:
    config = new_stack_config(
        Path(tmp_path_factory.mktemp("traced", numbered=True)),
        extra_env={
            "ENGRAM_ENV": "test", "LOG_LEVEL": "INFO", "LOG_FORMAT": "json",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            # Export within 0.1 s instead of the SDK's 5 s batches.
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    async with running(config) as stack:
        yield stack


async def _wait_for(receiver: OtlpReceiver, done: Callable[[list[Span]], bool], seconds: float = 90) -> list[Span]:
    deadline = time.monotonic() + seconds
    while True:
        spans = receiver.spans()
        if done(spans) or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.25)


def _arrived(spans: list[Span], tool: str, *wanted: tuple[str, str, str]) -> bool:
    """The tools/call span of `tool` and, in its trace, a span of each (service, kind, name
    prefix): each process exports on its own schedule."""
    calls = [s for s in spans if s.name == f"tools/call {tool}"]
    if not calls:
        return False
    trace = [s for s in spans if s.trace_id == calls[0].trace_id]
    return all(any(s.service == service and s.kind == kind and s.name.startswith(name) for s in trace)
               for service, kind, name in wanted)


def _one(spans: list[Span], **match: str) -> Span:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one span {match}, found {len(found)}: {[(s.service, s.name, s.kind) for s in found]}"
    return found[0]


def _descends(span: Span, ancestor: Span, by_id: dict[str, Span]) -> bool:
    current = span
    while current.parent_id:
        if current.parent_id == ancestor.span_id:
            return True
        parent = by_id.get(current.parent_id)
        if parent is None:
            return False
        current = parent
    return False


def _hop(spans: list[Span], tool: str, service: str) -> tuple[list[Span], Span]:
    """The trace of one MCP tools/call, checked from the gateway down to `service`'s server
    span; returns the trace's spans and that server span."""
    call_span = _one(spans, name=f"tools/call {tool}")
    trace = [s for s in spans if s.trace_id == call_span.trace_id]
    gateway = [s for s in trace if s.service == "engram-gateway"]
    http = _one(gateway, name="POST /mcp")
    assert http.kind == "server" and http.parent_id == "", http  # the trace's root
    # The MCP SDK's span for the message (MCP semantic conventions: kind server), under the
    # HTTP request's span: no second trace, no second tools/call span.
    assert call_span.service == "engram-gateway" and call_span.kind == "server"
    assert call_span.parent_id == http.span_id and call_span.attributes["gen_ai.tool.name"] == tool
    assert sorted(s.name for s in gateway if s.kind == "server") == ["POST /mcp", f"tools/call {tool}"]
    client = _one(trace, kind="client", name=f"POST {service} /v1/tools/{{name}}")
    assert client.service == "engram-gateway" and client.parent_id == call_span.span_id
    assert client.attributes["engram.tool"] == tool
    # Exactly one server span for the hop (no second one from FastAPI's own telemetry).
    server = _one(trace, kind="server", service=f"engram-{service}")
    assert server.parent_id == client.span_id and server.name == "POST /v1/tools/{name}"
    assert server.attributes["http.response.status_code"] == 200
    return trace, server


async def test_remember_is_one_trace_from_the_gateway_to_the_worker(traced_stack: Stack, receiver: OtlpReceiver) -> None:
    key, _ = await create_api_key(traced_stack.database_url)
    content = f"The deploy pipeline signs every image with cosign before the push ({unique('n')})."
    async with mcp_session(traced_stack.mcp_url, key, headers={"x-correlation-id": CID}) as s:
        stored = await call(s, "remember", {"content": content, "topic": "ops", "type": "fact"})
    assert stored["success"] is True

    spans = await _wait_for(receiver, lambda spans: _arrived(
        spans, "remember", ("engram-gateway", "server", "POST /mcp"), ("engram-gateway", "client", "POST ingest"),
        ("engram-ingest", "server", "POST"), ("engram-ingest", "producer", "apply_async/"),
        ("engram-maintenance", "consumer", "run/maintenance.link_new_fragments")))
    trace, ingest = _hop(spans, "remember", "ingest")
    by_id = {s.span_id: s for s in trace}
    # Postgres (asyncpg) and Redis calls of the write, inside ingest's server span.
    sql = [s for s in trace if s.service == "engram-ingest" and s.attributes.get("db.system") == "postgresql"]
    assert sql and all(s.kind == "client" and _descends(s, ingest, by_id) for s in sql)
    assert any("INSERT INTO fragments" in str(s.attributes.get("db.statement", "")) for s in sql)
    cache = [s for s in trace if s.service == "engram-ingest" and s.attributes.get("db.system") == "redis"]
    assert cache and all(_descends(s, ingest, by_id) for s in cache)
    # The job it recorded in the outbox is sent by the relay under the write's trace, and the
    # worker runs it as the producer span's child.
    producer = _one(trace, kind="producer", name="apply_async/maintenance.link_new_fragments")
    assert producer.service == "engram-ingest" and _descends(producer, ingest, by_id)
    consumer = _one(trace, kind="consumer", name="run/maintenance.link_new_fragments")
    assert consumer.service == "engram-maintenance" and consumer.parent_id == producer.span_id
    # Every span of the trace hangs off the gateway's root: nothing lost its parent.
    root = _one(trace, parent_id="")
    assert all(s is root or _descends(s, root, by_id) for s in trace)

    # The ingest process logs the call as JSON with the same trace id and the caller's cid.
    lines = [json.loads(line) for line in (traced_stack.log_dir / "ingest.log").read_text().splitlines() if line.startswith("{")]
    logged = [entry for entry in lines if entry.get("message", "").startswith("tool remember ok")]
    assert logged, "no JSON log line for the remember call"
    assert logged[-1]["trace_id"] == ingest.trace_id and logged[-1]["correlation_id"] == CID
    assert {"time", "level", "logger", "span_id"} <= set(logged[-1])


async def test_recall_is_one_trace_with_its_postgres_and_redis_calls(traced_stack: Stack, receiver: OtlpReceiver) -> None:
    key, _ = await create_api_key(traced_stack.database_url)
    async with mcp_session(traced_stack.mcp_url, key) as s:
        await call(s, "remember", {"content": "Backups of the orders database run nightly at 02:00 UTC.", "topic": "ops", "type": "fact"})
        found = await call(s, "recall", {"text": "when are database backups taken"})
    assert found["fragments"], found

    # The L1 write (SET) runs after the reply, so it is the recall's last span.
    spans = await _wait_for(receiver, lambda spans: _arrived(
        spans, "recall", ("engram-gateway", "server", "POST /mcp"), ("engram-gateway", "client", "POST recall"),
        ("engram-recall", "server", "POST"), ("engram-recall", "client", "SET")))
    trace, recall = _hop(spans, "recall", "recall")
    by_id = {s.span_id: s for s in trace}
    sql = [s for s in trace if s.service == "engram-recall" and s.attributes.get("db.system") == "postgresql"]
    assert sql and all(s.kind == "client" and _descends(s, recall, by_id) for s in sql)
    redis = [s for s in trace if s.service == "engram-recall" and s.attributes.get("db.system") == "redis"]
    assert redis and all(s.kind == "client" and _descends(s, recall, by_id) for s in redis)
    # The L1 cache: the tenant's generation counters, then the entry (a miss), then its write.
    assert {"MGET", "GET", "SET"} <= {s.name for s in redis}, sorted(s.name for s in redis)
    # One trace per call: the recall shares nothing with the remember before it.
    remember = [s for s in spans if s.name == "tools/call remember" and s.trace_id == recall.trace_id]
    assert not remember
