"""Session summaries of the mnemory REST surface (reference 004: /api/sessions) and the
/api/remember requests the worker has finished (migration 0019)."""

from __future__ import annotations

from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause

# reference 004: total_truncated says the server stopped counting at its internal safety cap.
LIST_SAFETY_CAP = 10_000
# What a summary keeps: the latest exchanges, newest last.
SUMMARY_MAX_CHARS = 4000
_COLUMNS = "s.session_id, s.agent_id, s.summary, s.memory_ids, s.consolidation_state, s.consolidated_memory_ids, " \
           "s.consolidated_at, s.created_at, s.updated_at"


def summary_to_wire(row: asyncpg.Record, *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "session_id": row["session_id"],
        "summary": row["summary"],
        "created_at": row["created_at"].isoformat(),
        "updated_at": row["updated_at"].isoformat(),
        "consolidation_state": row["consolidation_state"],
    }
    if row["agent_id"]:
        out["agent_id"] = row["agent_id"]
    if full:
        out["memory_ids"] = list(row["memory_ids"])
        out["consolidated_memory_ids"] = list(row["consolidated_memory_ids"])
        out["consolidated_at"] = row["consolidated_at"].isoformat() if row["consolidated_at"] else None
    return out


async def list_summaries(
    conn: asyncpg.Connection, principal: Principal, *, offset: int, limit: int, state: str | None, q: str | None,
    sort_by: str, sort_dir: str,
) -> tuple[list[asyncpg.Record], int, bool]:
    """One page, the total after filters (counted up to LIST_SAFETY_CAP) and whether the cap cut it."""
    params = SqlParams()
    where = [scope_clause(principal.owns, params, "s")]
    if state:
        where.append(f"s.consolidation_state = {params.add(state)}")
    if q and q.strip():
        needle = params.add(q.strip().lower())
        where.append(f"(strpos(lower(s.summary), {needle}) > 0 OR strpos(lower(s.session_id), {needle}) > 0)")
    condition = " AND ".join(where)
    order_column = "s.created_at" if sort_by == "created_at" else "s.updated_at"
    direction = "ASC" if sort_dir == "asc" else "DESC"
    count_params = list(params.values)
    cap = LIST_SAFETY_CAP
    counted = await conn.fetchval(
        f"SELECT count(*) FROM (SELECT 1 FROM mnemory_session_summaries s WHERE {condition} LIMIT {cap + 1}) c", *count_params
    )
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM mnemory_session_summaries s WHERE {condition}
            ORDER BY {order_column} {direction}, s.id {direction} OFFSET {params.add(offset)} LIMIT {params.add(limit)}""",
        *params.values,
    )
    truncated = int(counted) > cap
    return rows, min(int(counted), cap), truncated


async def get_summary(conn: asyncpg.Connection, principal: Principal, session_id: str, *, lock: bool = False) -> asyncpg.Record | None:
    params = SqlParams()
    where = scope_clause(principal.owns, params, "s")
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM mnemory_session_summaries s WHERE s.session_id = {params.add(session_id)} AND {where}"
        + (" FOR UPDATE" if lock else ""),
        *params.values,
    )


async def delete_summary(conn: asyncpg.Connection, principal: Principal, session_id: str) -> None:
    params = SqlParams()
    where = scope_clause(principal.owns, params, "s")
    await conn.execute(
        f"DELETE FROM mnemory_session_summaries s WHERE s.session_id = {params.add(session_id)} AND {where}", *params.values
    )


async def set_state(
    conn: asyncpg.Connection, principal: Principal, session_id: str, state: str, consolidated_ids: list[str] | None = None
) -> None:
    params = SqlParams()
    where = scope_clause(principal.owns, params, "s")
    done = ", consolidated_at = now()" if state == "consolidated" else ""
    ids = f", consolidated_memory_ids = {params.add(consolidated_ids)}::text[]" if consolidated_ids is not None else ""
    await conn.execute(
        f"""UPDATE mnemory_session_summaries s SET consolidation_state = {params.add(state)}{done}{ids}
            WHERE s.session_id = {params.add(session_id)} AND {where}""",
        *params.values,
    )


async def record_exchange(
    conn: asyncpg.Connection, key_id: str | None, session_id: str, agent_id: str | None, text: str, memory_ids: list[str]
) -> None:
    """Add one remembered exchange to its session's summary (made on first use): the text
    appended (the newest SUMMARY_MAX_CHARS kept), the stored memories linked, state back to
    idle so a later consolidation takes the new memories too."""
    await conn.execute(
        f"""
        INSERT INTO mnemory_session_summaries (key_id, session_id, agent_id, summary, memory_ids)
        VALUES ($1, $2, $3, right($4, {SUMMARY_MAX_CHARS}), $5::text[])
        ON CONFLICT ((coalesce(key_id, '')), session_id) DO UPDATE SET
            summary = right(mnemory_session_summaries.summary || E'\\n' || EXCLUDED.summary, {SUMMARY_MAX_CHARS}),
            memory_ids = ARRAY(SELECT DISTINCT unnest(mnemory_session_summaries.memory_ids || EXCLUDED.memory_ids)),
            agent_id = coalesce(mnemory_session_summaries.agent_id, EXCLUDED.agent_id),
            consolidation_state = CASE WHEN mnemory_session_summaries.consolidation_state = 'consolidating'
                                       THEN 'consolidating' ELSE 'idle' END,
            updated_at = now()
        """,
        key_id, session_id, agent_id, text, memory_ids,
    )


async def request_done(conn: asyncpg.Connection, request_id: str) -> list[str] | None:
    """The memories a finished /api/remember request stored, or None when it has not finished."""
    row = await conn.fetchrow("SELECT memory_ids FROM mnemory_remember_requests WHERE request_id = $1", request_id)
    return list(row["memory_ids"]) if row is not None else None


async def finish_request(conn: asyncpg.Connection, request_id: str, key_id: str | None, memory_ids: list[str]) -> bool:
    """Mark a request finished; False when another delivery finished it first."""
    done = await conn.fetchval(
        """INSERT INTO mnemory_remember_requests (request_id, key_id, memory_ids) VALUES ($1, $2, $3::text[])
           ON CONFLICT (request_id) DO NOTHING RETURNING request_id""",
        request_id, key_id, memory_ids,
    )
    return done is not None
