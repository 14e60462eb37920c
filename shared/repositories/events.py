"""Search events (the FK tool_feedback points at), recall's access side effects, tool feedback."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause

# Access bumps ema_activation towards 1 by this share per recall that returned the fragment.
ACTIVATION_ALPHA = 0.2


async def next_search_event_id(conn: asyncpg.Connection) -> int:
    """Reserve an id so the response can carry searchEventId before the row is written."""
    return int(await conn.fetchval("SELECT nextval(pg_get_serial_sequence('search_events', 'id'))"))


def search_event_row(
    *,
    event_id: int,
    key_id: str | None,
    session_id: str | None,
    query_type: str,
    query_text: str | None,
    keywords: list[str] | None,
    filters: dict[str, Any],
    result_ids: list[str],
    search_path: str,
    latency_ms: float,
) -> dict[str, Any]:
    return {
        "id": event_id, "key_id": key_id, "session_id": session_id, "query_type": query_type,
        "query_text": query_text, "keywords": keywords, "filters": filters, "result_ids": result_ids,
        "search_path": search_path, "latency_ms": latency_ms,
    }


async def apply_recall_effects(conn: asyncpg.Connection, effects: list[dict[str, Any]]) -> None:
    """One batch of deferred recall side effects: search events, then access counts, last
    access and activation of the returned fragments. Idempotent per event id for the events
    (a redelivered batch does not duplicate them); access counts are at-least-once."""
    events = [e["event"] for e in effects if e.get("event")]
    if events:
        await conn.executemany(
            """
            INSERT INTO search_events (id, key_id, session_id, query_type, query_text, keywords, filters,
                                       result_ids, result_count, search_path, latency_ms, created_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, coalesce($12::timestamptz, now()))
            ON CONFLICT (id) DO UPDATE SET
                key_id = EXCLUDED.key_id, session_id = EXCLUDED.session_id, query_type = EXCLUDED.query_type,
                query_text = EXCLUDED.query_text, keywords = EXCLUDED.keywords, filters = EXCLUDED.filters,
                result_ids = EXCLUDED.result_ids, result_count = EXCLUDED.result_count,
                search_path = EXCLUDED.search_path, latency_ms = EXCLUDED.latency_ms
            """,
            [
                (
                    e["id"], e["key_id"], e["session_id"], e["query_type"], e["query_text"], e["keywords"],
                    json.dumps(e["filters"], default=str), e["result_ids"], len(e["result_ids"]),
                    e["search_path"], e["latency_ms"], datetime.fromisoformat(e["at"]) if e.get("at") else None,
                )
                for e in events
            ],
        )
    accessed = Counter(fid for e in effects for fid in e.get("accessed", ()))
    if accessed:
        ids = list(accessed)
        await conn.execute(
            """
            UPDATE fragments f SET access_count = f.access_count + a.n,
                   last_accessed_at = now(),
                   ema_activation = least(1.0, 1.0 - (1.0 - f.ema_activation) * power(1.0 - $3::float8, a.n))
            FROM unnest($1::text[], $2::int[]) AS a(id, n) WHERE f.id = a.id
            """,
            ids, [accessed[i] for i in ids], ACTIVATION_ALPHA,
        )
    activated: Counter[str] = Counter()
    for e in effects:
        for fid, delta in e.get("activate", {}).items():
            activated[fid] += delta
    if activated:
        await adjust_activation(conn, dict(activated))


async def adjust_activation(conn: asyncpg.Connection, deltas: dict[str, float]) -> None:
    ids = list(deltas)
    await conn.execute(
        """
        UPDATE fragments f SET ema_activation = least(1.0, greatest(0.0, f.ema_activation + d.delta))
        FROM unnest($1::text[], $2::float8[]) AS d(id, delta) WHERE f.id = d.id
        """,
        ids, [float(deltas[i]) for i in ids],
    )


async def ensure_search_event(conn: asyncpg.Connection, event_id: int, key_id: str | None) -> bool:
    """A stub row for an event whose deferred write has not landed yet (tool_feedback can
    arrive first); the deferred write fills it in. False when the id was never issued."""
    issued = await conn.fetchval(
        "SELECT $1 <= (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM search_events_id_seq)", event_id
    )
    if not issued:
        return False
    await conn.execute(
        "INSERT INTO search_events (id, key_id, query_type) VALUES ($1, $2, 'pending') ON CONFLICT (id) DO NOTHING",
        event_id, key_id,
    )
    return True


async def search_event_owner(conn: asyncpg.Connection, event_id: int) -> tuple[bool, str | None]:
    row = await conn.fetchrow("SELECT key_id FROM search_events WHERE id = $1", event_id)
    return (row is not None, row["key_id"] if row else None)


async def recent_keyword_searches(conn: asyncpg.Connection, key_id: str | None, keywords: list[str], seconds: int) -> int:
    params = SqlParams()
    scope = scope_clause(TenantScope.key(key_id), params, "e")
    words = params.add(sorted(k.lower() for k in keywords))
    since = params.add(seconds)
    return int(
        await conn.fetchval(
            f"""
            SELECT count(*) FROM search_events e
            WHERE {scope} AND e.query_type IN ('keywords', 'mixed')
              AND e.created_at > now() - make_interval(secs => {since}) AND e.keywords = {words}::text[]
            """,
            *params.values,
        )
    )


async def insert_tool_feedback(conn: asyncpg.Connection, **row: Any) -> int:
    cols = list(row)
    placeholders = ", ".join(f"${i}" for i in range(1, len(cols) + 1))
    return int(
        await conn.fetchval(
            f"INSERT INTO tool_feedback ({', '.join(cols)}) VALUES ({placeholders}) RETURNING id", *row.values()
        )
    )
