"""Case events: the timeline of a case (seed event_type enum), written by amend."""

from __future__ import annotations

import asyncpg


async def record(
    conn: asyncpg.Connection, *, case_id: str, key_id: str | None, fragment_id: str, event_type: str, summary: str | None
) -> int:
    return int(
        await conn.fetchval(
            """
            INSERT INTO case_events (case_id, key_id, fragment_id, event_type, summary)
            VALUES ($1, $2, $3, $4, $5) RETURNING id
            """,
            case_id, key_id, fragment_id, event_type, summary,
        )
    )
