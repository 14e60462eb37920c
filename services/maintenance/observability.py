"""Per-task observability, wired through Celery signals so tasks stay thin:

- trace context (W3C traceparent) and the correlation id ride the task's headers
  (shared.telemetry.inject_headers on the sender); task_prerun opens a CONSUMER span under
  them, so one trace spans gateway -> ingest -> worker, and log lines carry the cid;
- Prometheus: runs by outcome, failures, retries and duration per task name, served by the
  worker's main process on WORKER_METRICS_PORT over every pool process's samples.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery.signals import task_failure, task_postrun, task_prerun, task_retry, worker_init, worker_process_shutdown
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server

from shared.settings import MaintenanceSettings
from shared.telemetry import CORRELATION_HEADER, correlation_id, extract_context, new_correlation_id

logger = logging.getLogger(__name__)

TASK_RUNS = Counter("engram_task_runs_total", "Celery task runs by final state", ["task", "state"])
TASK_FAILURES = Counter("engram_task_failures_total", "Celery task runs that raised", ["task", "exception"])
TASK_RETRIES = Counter("engram_task_retries_total", "Celery task retries", ["task"])
TASK_DURATION = Histogram(
    "engram_task_duration_seconds", "Celery task duration", ["task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)

_tracer = trace.get_tracer("engram.maintenance")


def task_headers(request: Any) -> dict[str, str]:
    """Custom message headers of the running task (Celery keeps them on the request)."""
    headers: dict[str, str] = {}
    for source in (getattr(request, "headers", None) or {}, vars(request)):
        for key in ("traceparent", "tracestate", CORRELATION_HEADER):
            value = source.get(key)
            if isinstance(value, str) and key not in headers:
                headers[key] = value
    return headers


@task_prerun.connect
def _before(task_id: str, task: Any, **_: Any) -> None:
    headers = task_headers(task.request)
    correlation_id.set(headers.get(CORRELATION_HEADER) or new_correlation_id())
    span = _tracer.start_span(task.name, context=extract_context(headers), kind=trace.SpanKind.CONSUMER)
    span.set_attribute("celery.task_id", task_id)
    token = otel_context.attach(trace.set_span_in_context(span))
    task.request.engram_observed = (time.perf_counter(), span, token)


@task_postrun.connect
def _after(task_id: str, task: Any, state: str | None = None, **_: Any) -> None:
    observed = getattr(task.request, "engram_observed", None)
    TASK_RUNS.labels(task.name, state or "UNKNOWN").inc()
    if observed is None:
        return
    began, span, token = observed
    TASK_DURATION.labels(task.name).observe(time.perf_counter() - began)
    span.set_attribute("celery.state", state or "UNKNOWN")
    span.end()
    otel_context.detach(token)
    task.request.engram_observed = None


@task_failure.connect
def _failed(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    TASK_FAILURES.labels(getattr(sender, "name", "unknown"), exception.__class__.__name__ if exception else "unknown").inc()


@task_retry.connect
def _retried(sender: Any = None, **_: Any) -> None:
    TASK_RETRIES.labels(getattr(sender, "name", "unknown")).inc()


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    port = MaintenanceSettings().worker_metrics_port
    # prometheus_client's own switch (set by metrics_env for `celery worker`), not a setting.
    if not port or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    try:
        start_http_server(port, addr="0.0.0.0", registry=registry)  # noqa: S104 - Prometheus scrapes the pod from outside
    except OSError:
        logger.warning("worker metrics port %s is taken; /metrics not served", port, exc_info=True)
        return
    logger.info("worker metrics on :%s/metrics", port)


@worker_process_shutdown.connect
def _process_gone(**_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())
