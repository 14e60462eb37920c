"""Small factories: fragments, keys and runs written straight into the maintenance stack's
database, and maintenance tasks sent to its real worker."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg

from shared.domain.fragment import content_hash, new_fragment_id
from shared.jobs import QUEUE_MAINTENANCE
from shared.telemetry import inject_headers
from tests.support import create_api_key, unique


async def new_key(database_url: str, **fields: Any) -> tuple[str, str]:
    return await create_api_key(database_url, unique("mkey"), **fields)


async def add_fragment(
    db: asyncpg.Connection, embedder: Any, content: str, *, key_id: str | None, topic: str = "ops",
    type: str = "fact", workspace: str | None = None, age_days: float = 0, importance: float = 0.5,
    is_anchor: bool = False, access_count: int = 0, accessed_days_ago: float | None = None,
    embed: bool = True, session_id: str | None = None, ttl_tier: str = "warm", **extra: Any,
) -> str:
    fid = new_fragment_id()
    created = datetime.now(timezone.utc) - timedelta(days=age_days)
    accessed = datetime.now(timezone.utc) - timedelta(days=accessed_days_ago) if accessed_days_ago is not None else None
    vector = embedder.embed([content])[0] if embed else None
    columns = {
        "id": fid, "content": content, "topic": topic, "type": type, "keywords": [], "importance": importance,
        "is_anchor": is_anchor, "key_id": key_id, "workspace": workspace, "content_hash": content_hash(content),
        "embedding": vector, "created_at": created, "valid_from": created, "access_count": access_count,
        "last_accessed_at": accessed, "session_id": session_id, "ttl_tier": ttl_tier, **extra,
    }
    names = ", ".join(columns)
    marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    await db.execute(f"INSERT INTO fragments ({names}) VALUES ({marks})", *columns.values())
    return fid


async def run_task(
    db: asyncpg.Connection, producer: Any, *, tenant: str, stages: list[str] | None = None,
    headers: dict[str, str] | None = None, timeout: float = 120.0,
) -> dict[str, Any]:
    """A consolidation run through the real worker: row first, then the task, then wait."""
    run_id = await db.fetchval(
        "INSERT INTO maintenance_runs (job, tenant, params, status) VALUES ('consolidate', $1, '{}', 'queued') RETURNING id",
        tenant,
    )
    await asyncio.to_thread(
        producer.send_task, "maintenance.consolidate",
        kwargs={"run_id": run_id, "tenant": tenant, "stages": stages},
        queue=QUEUE_MAINTENANCE, headers=headers if headers is not None else inject_headers({}),
    )
    return await wait_run(db, run_id, timeout)


async def wait_run(db: asyncpg.Connection, run_id: int, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await db.fetchrow("SELECT * FROM maintenance_runs WHERE id = $1", run_id)
        if row["status"] not in ("queued", "running"):
            result = row["result"]
            return {"status": row["status"], "error": row["error"],
                    "result": json.loads(result) if isinstance(result, str) else result}
        await asyncio.sleep(0.25)
    raise AssertionError(f"run {run_id} still {row['status']} after {timeout} s")


async def fragment(db: asyncpg.Connection, fid: str) -> asyncpg.Record | None:
    return await db.fetchrow("SELECT * FROM fragments WHERE id = $1", fid)


async def links(db: asyncpg.Connection, ids: list[str], relation: str | None = None) -> list[asyncpg.Record]:
    rows = await db.fetch(
        "SELECT * FROM fragment_links WHERE (from_id = ANY($1::text[]) OR to_id = ANY($1::text[]))", ids
    )
    return [r for r in rows if relation is None or r["relation_type"] == relation]
