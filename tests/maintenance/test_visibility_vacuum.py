"""The visibility vacuum (maintenance.visibility_vacuum, every VISIBILITY_VACUUM_INTERVAL by
beat): recall's own updates of the rows it returns (access counts, activation) clear their
heap pages' all-visible bits, which the scope counts' and the exact ranking's index-only
scans need, and which autovacuum's dead-tuple threshold never restores (HOT updates are
pruned on the page). The task, run by the worker, sets them again."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from shared.jobs import QUEUE_MAINTENANCE
from tests.maintenance.conftest import wait_for
from tests.maintenance.factories import add_fragment, new_key
from tests.support import unique


async def _pages(db: asyncpg.Connection, ids: list[str]) -> dict[int, bool]:
    """Each heap page holding one of these rows, and whether the visibility map marks it all-visible."""
    return {
        r["blk"]: r["all_visible"]
        for r in await db.fetch(
            """SELECT b.blk, v.all_visible FROM (SELECT DISTINCT (ctid::text::point)[0]::bigint AS blk
                                                 FROM fragments WHERE id = ANY($1::text[])) b
               CROSS JOIN LATERAL pg_visibility_map('fragments'::regclass, b.blk) v""",
            ids,
        )
    }


async def test_recall_updates_clear_the_map_and_the_task_sets_it_again(mstack, db, embedder, producer) -> None:  # type: ignore[no-untyped-def]
    await db.execute("CREATE EXTENSION IF NOT EXISTS pg_visibility")
    _, key = await new_key(mstack.database_url)
    ws = unique("ws")
    ids = [await add_fragment(db, embedder, f"Visibility fact {i}: the replica lags by {i} seconds.", key_id=key,
                              workspace=ws, embed=False) for i in range(12)]

    # Only the task may set the bits here: autovacuum (naptime 5 s) could vacuum this
    # package's small table on its insert threshold.
    await db.execute("ALTER TABLE fragments SET (autovacuum_enabled = false)")
    try:
        await _updated_then_vacuumed(db, producer, ids)
    finally:
        await db.execute("ALTER TABLE fragments RESET (autovacuum_enabled)")


async def _updated_then_vacuumed(db: asyncpg.Connection, producer, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    # What recall's side effects do to every fragment a recall returned (events.record_effects).
    await db.execute(
        "UPDATE fragments SET access_count = access_count + 1, last_accessed_at = now(), ema_activation = 0.5 WHERE id = ANY($1::text[])",
        ids,
    )
    before = await _pages(db, ids)
    assert before and not any(before.values()), before  # an updated row's page is never all-visible

    async def visible() -> bool | None:
        pages = await _pages(db, ids)
        if all(pages.values()):
            return True
        # A transaction open elsewhere in this database can keep VACUUM from marking a page;
        # the next run does. Send the task again until then.
        await asyncio.to_thread(producer.send_task, "maintenance.visibility_vacuum", queue=QUEUE_MAINTENANCE)
        await asyncio.sleep(1)
        return None

    assert await wait_for(visible, timeout=90), await _pages(db, ids)


def test_beat_runs_it_every_ten_minutes_and_zero_turns_it_off() -> None:
    from services.maintenance.celery_app import beat_schedule
    from shared.settings import MaintenanceSettings

    schedule = beat_schedule(MaintenanceSettings())
    assert schedule["maintenance.visibility_vacuum"]["schedule"] == timedelta(minutes=10).total_seconds()
    off = MaintenanceSettings.model_validate({"VISIBILITY_VACUUM_INTERVAL": "PT0S"})
    assert "maintenance.visibility_vacuum" not in beat_schedule(off)


def test_beat_checks_the_type_graphs_every_ten_minutes_and_zero_turns_it_off() -> None:
    from services.maintenance.celery_app import beat_schedule
    from shared.settings import MaintenanceSettings

    schedule = beat_schedule(MaintenanceSettings())
    assert schedule["maintenance.type_graphs"] == {"task": "maintenance.type_graphs", "schedule": 600.0}
    off = MaintenanceSettings.model_validate({"TYPE_GRAPH_INTERVAL": "PT0S"})
    assert "maintenance.type_graphs" not in beat_schedule(off)


def test_beat_checks_the_vector_cells_every_ten_minutes_and_zero_turns_it_off() -> None:
    from services.maintenance.celery_app import beat_schedule
    from shared.settings import MaintenanceSettings

    schedule = beat_schedule(MaintenanceSettings())
    assert schedule["maintenance.vector_cells"] == {"task": "maintenance.vector_cells", "schedule": 600.0}
    assert MaintenanceSettings().vector_cells_min_rows == 200_000
    assert MaintenanceSettings().vector_cells_retrain_growth == 2.0
    assert MaintenanceSettings.model_validate({"VECTOR_CELLS_RETRAIN_GROWTH": "0"}).vector_cells_retrain_growth == 0
    with pytest.raises(ValueError, match="VECTOR_CELLS_RETRAIN_GROWTH"):
        MaintenanceSettings.model_validate({"VECTOR_CELLS_RETRAIN_GROWTH": "1"})
    off = MaintenanceSettings.model_validate({"VECTOR_CELLS_INTERVAL": "PT0S"})
    assert "maintenance.vector_cells" not in beat_schedule(off)
