"""Celery tasks: open the runtime, call a plain function in service.py, return."""

from __future__ import annotations

import asyncpg

from services.maintenance import service
from services.maintenance.celery_app import app
from services.maintenance.runtime import runtime

RETRYABLE = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)


@app.task(name="maintenance.link_new_fragments", autoretry_for=RETRYABLE, retry_backoff=True, max_retries=3)
def link_new_fragments(fragment_ids: list[str]) -> int:
    return runtime().run(lambda pool: service.link_new_fragments(pool, fragment_ids))


@app.task(name="maintenance.link_sweep", autoretry_for=RETRYABLE, retry_backoff=True, max_retries=3)
def link_sweep() -> int:
    return runtime().run(service.link_sweep)
