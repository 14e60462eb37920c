"""The Celery app of the maintenance worker and beat (Redis broker, named queues)."""

from __future__ import annotations

# isort: off
# First: it must set prometheus_client's multiprocess directory before anything imports it.
from services.maintenance import metrics_env  # noqa: F401
# isort: on

from celery import Celery
from kombu import Queue

from shared.jobs import QUEUE_BATCH, QUEUE_MAINTENANCE
from shared.settings import MaintenanceSettings

settings = MaintenanceSettings()
# Worker and beat refuse placeholder or default secrets under ENGRAM_ENV=production.
settings.check_secure()


def beat_schedule(s: MaintenanceSettings) -> dict[str, dict]:
    schedule: dict[str, dict] = {
        "maintenance.link_sweep": {"task": "maintenance.link_sweep", "schedule": s.link_sweep_interval.total_seconds()},
        "maintenance.reflect_sweep": {"task": "maintenance.reflect_sweep", "schedule": s.reflect_sweep_interval.total_seconds()},
        "maintenance.outbox_relay": {"task": "maintenance.outbox_relay", "schedule": s.outbox_relay_interval.total_seconds()},
    }
    if s.consolidate_enabled:
        # seed: the scheduler runs the full cycle every 6 hours by default.
        schedule["maintenance.consolidate"] = {
            "task": "maintenance.consolidate", "schedule": s.consolidate_interval.total_seconds(),
        }
        schedule["maintenance.embedding_backfill"] = {
            "task": "maintenance.embedding_backfill", "schedule": s.embedding_backfill_interval.total_seconds(),
        }
    if s.visibility_vacuum_interval.total_seconds() > 0:
        schedule["maintenance.visibility_vacuum"] = {
            "task": "maintenance.visibility_vacuum", "schedule": s.visibility_vacuum_interval.total_seconds(),
        }
    if s.type_graph_interval.total_seconds() > 0:
        schedule["maintenance.type_graphs"] = {"task": "maintenance.type_graphs", "schedule": s.type_graph_interval.total_seconds()}
    if s.vector_cells_interval.total_seconds() > 0:
        schedule["maintenance.vector_cells"] = {
            "task": "maintenance.vector_cells", "schedule": s.vector_cells_interval.total_seconds(),
        }
    if s.fsck_auto_interval.total_seconds() > 0:
        schedule["maintenance.auto_fsck"] = {"task": "maintenance.auto_fsck", "schedule": s.fsck_auto_interval.total_seconds()}
    return schedule


app = Celery(
    "engram", broker=settings.broker_url or settings.redis_url,
    include=["services.maintenance.tasks", "services.maintenance.batch_worker", "services.maintenance.mnemory_tasks"],
)
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
    # Pool processes log through shared.telemetry's handler (cid + trace id on each line);
    # with Celery's stdout redirection that handler would write into Celery's own logger.
    worker_redirect_stdouts=False,
    beat_schedule=beat_schedule(settings),
)

from services.maintenance import observability  # noqa: E402,F401  (signal handlers)
