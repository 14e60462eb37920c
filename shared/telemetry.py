"""Tracing and logging set-up shared by every process (services, worker, beat).

Traces: OpenTelemetry's SDK gives each request a real trace id that rides W3C `traceparent`
headers gateway -> recall/ingest -> Celery. They leave the process over OTLP/HTTP when the
standard variables ask for it (OTEL_EXPORTER_OTLP_ENDPOINT or ..._TRACES_ENDPOINT, or
OTEL_TRACES_EXPORTER=otlp); the exporter itself reads the rest (OTEL_EXPORTER_OTLP_HEADERS,
_TIMEOUT, _COMPRESSION, OTEL_BSP_*, OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES). Only then
are Postgres (asyncpg) and Redis calls traced too: spans nobody receives would cost every
query CPU. Celery's own instrumentation always runs (producer and consumer spans, context in
the task headers), so a worker's log lines carry the trace id of the write that sent the job.

Logs: text (`make run`, tests) or JSON (LOG_FORMAT=json; the default under
ENGRAM_ENV=production), each line with the trace id, span id and correlation id.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from pythonjsonlogger.json import JsonFormatter

from shared.settings import CommonSettings

correlation_id: contextvars.ContextVar[str] = contextvars.ContextVar("correlation_id", default="-")
CORRELATION_HEADER = "x-correlation-id"

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [cid=%(correlation_id)s trace=%(trace_id)s] %(message)s"
JSON_FIELDS = ("asctime", "levelname", "name", "message", "correlation_id", "trace_id", "span_id")


class _CorrelationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.correlation_id = correlation_id.get()
        span = trace.get_current_span().get_span_context()
        record.trace_id = format(span.trace_id, "032x") if span.is_valid else "-"
        record.span_id = format(span.span_id, "016x") if span.is_valid else "-"
        return True


def configure_logging(level: str = "INFO", log_format: Literal["text", "json"] = "text") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(_CorrelationFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter(
            list(JSON_FIELDS), rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        ))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def configure_tracing(service_name: str, *, console: bool = False, otlp: bool = False) -> TracerProvider:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES, and OTEL_SERVICE_NAME wins over our name.
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    _instrument(datastores=otlp)
    return provider


def _instrument(*, datastores: bool) -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()
    if datastores:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        AsyncPGInstrumentor().instrument()
        RedisInstrumentor().instrument()


def configure_telemetry(settings: CommonSettings, service_name: str) -> None:
    """Logging and tracing of one process, from its settings (OTEL_SERVICE_NAME wins)."""
    configure_logging(settings.log_level, settings.effective_log_format)
    if settings.otel_sdk_disabled:
        return
    configure_tracing(
        settings.otel_service_name or service_name,
        console=settings.otel_console or "console" in settings.otel_exporters,
        otlp=settings.otlp_traces,
    )


def flush_traces() -> None:
    """Export what is buffered (a Celery pool process exits without running atexit)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(timeout_millis=5000)


def new_correlation_id() -> str:
    return uuid.uuid4().hex[:16]


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add traceparent (+ tracestate) and the correlation id to outgoing headers."""
    propagate.inject(headers)
    headers[CORRELATION_HEADER] = correlation_id.get()
    return headers


def extract_context(headers: dict[str, str]) -> Context:
    return propagate.extract(headers)


@contextmanager
def recorded_context(headers: Mapping[str, Any]) -> Iterator[None]:
    """Run under the trace context and correlation id that `headers` recorded (a job written
    to the outbox by a request and sent later by the relay: the send belongs to that trace)."""
    token = otel_context.attach(propagate.extract(dict(headers)))
    cid = correlation_id.set(headers.get(CORRELATION_HEADER) or correlation_id.get())
    try:
        yield
    finally:
        correlation_id.reset(cid)
        otel_context.detach(token)
