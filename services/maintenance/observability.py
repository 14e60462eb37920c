"""Per-task observability, wired through Celery signals so tasks stay thin:

- trace context (W3C traceparent) and the correlation id ride the task's headers
  (Celery's OpenTelemetry instrumentation on both sides, shared/telemetry.py), so one trace
  spans gateway -> ingest -> worker, and log lines carry the cid;
- Prometheus: runs by outcome, failures, retries and duration per task name, served by the
  worker's main process on WORKER_METRICS_PORT over every pool process's samples, with the
  Redis queues' depths read at scrape time (shared/metrics.py).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery.signals import task_failure, task_postrun, task_prerun, task_retry, worker_init, worker_process_shutdown
from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server

from shared.metrics import QueueDepthCollector
from shared.settings import MaintenanceSettings
from shared.telemetry import CORRELATION_HEADER, correlation_id, flush_traces, new_correlation_id

logger = logging.getLogger(__name__)

TASK_RUNS = Counter("engram_task_runs_total", "Celery task runs by final state", ["task", "state"])
TASK_FAILURES = Counter("engram_task_failures_total", "Celery task runs that raised", ["task", "exception"])
TASK_RETRIES = Counter("engram_task_retries_total", "Celery task retries", ["task"])
TASK_DURATION = Histogram(
    "engram_task_duration_seconds", "Celery task duration", ["task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)

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
    # The CONSUMER span is Celery's instrumentation's (shared/telemetry.py), under the
    # traceparent the sender put in the headers; the correlation id rides beside it.
    headers = task_headers(task.request)
    correlation_id.set(headers.get(CORRELATION_HEADER) or new_correlation_id())
    task.request.engram_observed = time.perf_counter()


@task_postrun.connect
def _after(task_id: str, task: Any, state: str | None = None, **_: Any) -> None:
    began = getattr(task.request, "engram_observed", None)
    TASK_RUNS.labels(task.name, state or "UNKNOWN").inc()
    if began is None:
        return
    TASK_DURATION.labels(task.name).observe(time.perf_counter() - began)
    task.request.engram_observed = None


@task_failure.connect
def _failed(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    TASK_FAILURES.labels(getattr(sender, "name", "unknown"), exception.__class__.__name__ if exception else "unknown").inc()


@task_retry.connect
def _retried(sender: Any = None, **_: Any) -> None:
    TASK_RETRIES.labels(getattr(sender, "name", "unknown")).inc()


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    settings = MaintenanceSettings()
    port = settings.worker_metrics_port
    # prometheus_client's own switch (set by metrics_env for `celery worker`), not a setting.
    if not port or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    if settings.redis_active:
        registry.register(QueueDepthCollector(settings.redis_url, settings.broker_url))
    try:
        start_http_server(port, addr="0.0.0.0", registry=registry)  # noqa: S104 - Prometheus scrapes the pod from outside
    except OSError:
        logger.warning("worker metrics port %s is taken; /metrics not served", port, exc_info=True)
        return
    logger.info("worker metrics on :%s/metrics", port)


@worker_process_shutdown.connect
def _process_gone(**_: Any) -> None:
    flush_traces()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())
