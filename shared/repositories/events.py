"""Search events (the FK tool_feedback points at)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg


async def record_search(
    conn: asyncpg.Connection,
    *,
    key_id: str | None,
    session_id: str | None,
    query_type: str,
    query_text: str | None,
    keywords: list[str] | None,
    filters: dict[str, Any],
    result_ids: list[str],
    search_path: str,
    latency_ms: float,
) -> int:
    return int(
        await conn.fetchval(
            """
            INSERT INTO search_events (key_id, session_id, query_type, query_text, keywords, filters,
                                       result_ids, result_count, search_path, latency_ms)
            VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10) RETURNING id
            """,
            key_id, session_id, query_type, query_text, keywords, json.dumps(filters, default=str),
            result_ids, len(result_ids), search_path, latency_ms,
        )
    )
