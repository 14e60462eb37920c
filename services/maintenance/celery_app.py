"""The Celery app of the maintenance worker and beat (Redis broker, named queues)."""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from shared.jobs import QUEUE_BATCH, QUEUE_MAINTENANCE
from shared.settings import MaintenanceSettings

settings = MaintenanceSettings()

app = Celery("engram", broker=settings.broker_url or settings.redis_url, include=["services.maintenance.tasks", "services.maintenance.batch_worker"])
app.conf.update(
    task_default_queue=QUEUE_MAINTENANCE,
    task_queues=(Queue(QUEUE_MAINTENANCE), Queue(QUEUE_BATCH)),
    # A task is acknowledged only after it finished: a crashed worker's task runs again,
    # so every task is idempotent.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    beat_schedule={
        "maintenance.link_sweep": {
            "task": "maintenance.link_sweep",
            "schedule": settings.link_sweep_interval.total_seconds(),
        },
    },
)
