"""The memory event outbox (migration 0017): memory:* events written with the write that made
them, appended to the Redis stream outside the request (shared/memory_events.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from shared.repositories import locks

# Postgres delivers a NOTIFY on this channel when (and only if) the recording transaction
# commits; the relays LISTEN on it.
CHANNEL = "engram_memory_events"


@dataclass(frozen=True)
class OutboxEvent:
    id: int
    type: str
    key_id: str | None
    payload: dict[str, Any]


async def insert(conn: asyncpg.Connection, sink: str, rows: list[tuple[str, str | None, dict[str, Any]]]) -> None:
    """(type, key_id, payload) rows, in the caller's transaction, and the commit-time wake-up."""
    await conn.executemany(
        "INSERT INTO memory_event_outbox (sink, type, key_id, payload) VALUES ($1, $2, $3, $4::jsonb)",
        [(sink, event_type, key_id, json.dumps(payload)) for event_type, key_id, payload in rows],
    )
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, sink)


async def claim(conn: asyncpg.Connection, sink: str, limit: int) -> list[OutboxEvent]:
    """The oldest rows of this sink, locked until the caller's transaction ends.

    One relay at a time claims a sink's rows: the others wait here for its commit. With
    SKIP LOCKED alone, a relay that locked rows 1-2 and one that skipped them and took row 3
    race to the stream, and row 3 can be appended first (a new bank's entries-changed before
    its namespaces-changed); every ingest replica runs a relay."""
    await locks.lock_for_transaction(conn, f"memory_event_relay:{sink}")
    rows = await conn.fetch(
        """
        SELECT id, type, key_id, payload FROM memory_event_outbox
        WHERE sink = $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
        """,
        sink, limit,
    )
    return [OutboxEvent(r["id"], r["type"], r["key_id"], json.loads(r["payload"])) for r in rows]


async def delete(conn: asyncpg.Connection, ids: list[int]) -> None:
    if ids:
        await conn.execute("DELETE FROM memory_event_outbox WHERE id = ANY($1::bigint[])", ids)


async def depth(conn: asyncpg.Connection, sink: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM memory_event_outbox WHERE sink = $1", sink)
