"""Tracing and logging set-up shared by every process (services, worker, beat).

OpenTelemetry's SDK provider gives each request a real trace id that rides W3C
`traceparent` headers gateway -> recall/ingest -> Celery; an exporter is attached only when
configured (console here; OTLP in a deployment that installs it).
"""

from __future__ import annotations

import contextvars
import logging
import uuid

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

correlation_id: contextvars.ContextVar[str] = contextvars.ContextVar("correlation_id", default="-")
CORRELATION_HEADER = "x-correlation-id"


class _CorrelationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.correlation_id = correlation_id.get()
        span = trace.get_current_span().get_span_context()
        record.trace_id = format(span.trace_id, "032x") if span.is_valid else "-"
        return True


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(_CorrelationFilter())
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s [cid=%(correlation_id)s trace=%(trace_id)s] %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def configure_tracing(service_name: str, *, console: bool = False) -> TracerProvider:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def new_correlation_id() -> str:
    return uuid.uuid4().hex[:16]


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add traceparent (+ tracestate) and the correlation id to outgoing headers."""
    propagate.inject(headers)
    headers[CORRELATION_HEADER] = correlation_id.get()
    return headers


def extract_context(headers: dict[str, str]) -> Context:
    return propagate.extract(headers)
