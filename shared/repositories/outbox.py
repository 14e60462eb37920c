"""The job outbox (migration 0013): jobs written with the write that made them, relayed to
Celery outside the request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg


@dataclass(frozen=True)
class OutboxJob:
    id: int
    task: str
    queue: str
    kwargs: dict[str, Any]
    headers: dict[str, Any]


async def insert(
    conn: asyncpg.Connection, broker: str, task: str, queue: str, kwargs: dict[str, Any], headers: dict[str, Any]
) -> None:
    await conn.execute(
        "INSERT INTO job_outbox (broker, task, queue, kwargs, headers) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb)",
        broker, task, queue, json.dumps(kwargs), json.dumps(headers),
    )


async def claim(conn: asyncpg.Connection, broker: str, limit: int, tasks: list[str] | None = None) -> list[OutboxJob]:
    """The oldest rows of this broker (and of these tasks, or all) no other relay holds,
    locked until the caller's transaction ends."""
    rows = await conn.fetch(
        """
        SELECT id, task, queue, kwargs, headers FROM job_outbox
        WHERE broker = $1 AND ($3::text[] IS NULL OR task = ANY($3::text[]))
        ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
        """,
        broker, limit, tasks,
    )
    return [
        OutboxJob(r["id"], r["task"], r["queue"], json.loads(r["kwargs"]), json.loads(r["headers"])) for r in rows
    ]


async def delete(conn: asyncpg.Connection, ids: list[int]) -> None:
    if ids:
        await conn.execute("DELETE FROM job_outbox WHERE id = ANY($1::bigint[])", ids)


async def depth(conn: asyncpg.Connection, broker: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM job_outbox WHERE broker = $1", broker)
