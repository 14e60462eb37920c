"""Background jobs from the request path: buffered during a transaction, sent after commit.

A job that reads a row must not be sent before the row exists, and a rolled-back write
must send nothing. Ingest collects jobs in a JobBuffer and flushes it only after its
transaction commits. Jobs are addressed by dotted task name, so the sender never imports
the worker's code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from prometheus_client import Counter

from shared.telemetry import inject_headers

logger = logging.getLogger(__name__)

JOBS_SENT = Counter("engram_jobs_enqueued_total", "Background jobs enqueued", ["task", "outcome"])

QUEUE_MAINTENANCE = "maintenance"
QUEUE_BATCH = "batch"


def celery_client(broker_url: str) -> Celery:
    """A producer-only Celery app (no task code)."""
    app = Celery("engram-producer", broker=broker_url)
    app.conf.update(broker_connection_retry_on_startup=False, broker_connection_max_retries=0)
    app.conf.broker_transport_options = {"socket_connect_timeout": 2, "socket_timeout": 2}
    return app


@dataclass
class Job:
    task: str
    kwargs: dict[str, Any]
    queue: str = QUEUE_MAINTENANCE


@dataclass
class JobBuffer:
    jobs: list[Job] = field(default_factory=list)

    def add(self, task: str, queue: str = QUEUE_MAINTENANCE, **kwargs: Any) -> None:
        self.jobs.append(Job(task, kwargs, queue))

    def send(self, client: Celery | None) -> list[Job]:
        """Send every buffered job; return those that could not be sent."""
        unsent: list[Job] = []
        for job in self.jobs:
            if client is None:
                unsent.append(job)
                continue
            try:
                client.send_task(job.task, kwargs=job.kwargs, queue=job.queue, headers=inject_headers({}), retry=False)
                JOBS_SENT.labels(job.task, "sent").inc()
            except Exception:  # kombu raises several transport errors; the job is kept either way
                logger.warning("could not enqueue %s; it will run inline", job.task, exc_info=True)
                JOBS_SENT.labels(job.task, "failed").inc()
                unsent.append(job)
        self.jobs.clear()
        return unsent
