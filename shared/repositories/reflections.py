"""What reflect reads: a session's fragments, grouped workspace -> case -> topic."""

from __future__ import annotations

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause

# Contents sampled per group to synthesise its episode (most important first).
GROUP_SAMPLE = 5


async def session_groups(conn: asyncpg.Connection, principal: Principal, session_id: str, exclude_topic: str) -> list[asyncpg.Record]:
    """The caller's own live fragments of one session, one row per (workspace, case, topic),
    largest group first."""
    params = SqlParams()
    sid = params.add(session_id)
    return await conn.fetch(
        f"""
        SELECT f.workspace, f.case_id, f.topic, count(*) AS n,
               (array_agg(f.content ORDER BY f.importance DESC, f.created_at))[1:{GROUP_SAMPLE}] AS contents,
               max(f.created_at) AS last_at
        FROM fragments f
        WHERE f.session_id = {sid} AND f.valid_to IS NULL AND f.topic <> {params.add(exclude_topic)}
          AND {scope_clause(principal.writes, params)}
        GROUP BY f.workspace, f.case_id, f.topic
        ORDER BY n DESC, last_at DESC
        """,
        *params.values,
    )
