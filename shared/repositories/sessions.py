"""MCP sessions as the gateway sees them: one row per session segment.

A row's id is what fragments store as session_id: `{transportId}#{seq}` with segments on,
the transport id otherwise. A row is ended (ended_at, end_reason) when its segment rotates,
its session is rotated or closed; reflect picks up ended, unreflected rows.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

# Bounded so a chatty session cannot grow its row without limit.
MAX_ACTIVITY = 200


async def start(
    conn: asyncpg.Connection, *, session_id: str, transport_id: str, key_id: str | None,
    workspace: str | None, mode: str | None, seq: int, previous_id: str | None = None,
) -> None:
    await conn.execute(
        """
        INSERT INTO sessions (id, transport_id, key_id, workspace, mode, seq, previous_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (id) DO UPDATE SET last_activity_at = now(), ended_at = NULL, end_reason = NULL
        """,
        session_id, transport_id, key_id, workspace, mode, seq, previous_id,
    )


async def record_activity(conn: asyncpg.Connection, session_id: str, entries: list[dict[str, Any]]) -> None:
    """Append tool-call entries (the gateway writes them in batches), up to MAX_ACTIVITY."""
    await conn.execute(
        """
        UPDATE sessions SET last_activity_at = now(),
            activity = CASE WHEN jsonb_array_length(activity) < $3 THEN (
                SELECT jsonb_agg(e ORDER BY n) FROM (
                    SELECT e, n FROM jsonb_array_elements(activity || $2::jsonb) WITH ORDINALITY AS t(e, n)
                    ORDER BY n LIMIT $3
                ) kept
            ) ELSE activity END
        WHERE id = $1
        """,
        session_id, json.dumps(entries), MAX_ACTIVITY,
    )


async def end(conn: asyncpg.Connection, session_id: str, reason: str) -> bool:
    """End a segment; False when it was already ended (so reflect is asked for once)."""
    return (
        await conn.fetchval(
            "UPDATE sessions SET ended_at = now(), end_reason = $2 WHERE id = $1 AND ended_at IS NULL RETURNING true",
            session_id, reason,
        )
        is not None
    )


async def get(conn: asyncpg.Connection, session_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", session_id)


async def for_transport(conn: asyncpg.Connection, transport_id: str) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM sessions WHERE transport_id = $1 ORDER BY seq, started_at", transport_id)
