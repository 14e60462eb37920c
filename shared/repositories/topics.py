"""Distinct topics the caller can see (memory://topics)."""

from __future__ import annotations

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause


async def list_topics(conn: asyncpg.Connection, principal: Principal, limit: int = 500) -> list[dict[str, object]]:
    params = SqlParams()
    where = scope_clause(principal.reads, params)
    rows = await conn.fetch(
        f"""
        SELECT f.topic, count(*) AS count FROM fragments f
        WHERE {where} AND f.valid_to IS NULL
        GROUP BY f.topic ORDER BY count(*) DESC, f.topic LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [{"topic": r["topic"], "count": r["count"]} for r in rows]
