"""Read-side queries of the history tools: traces, timelines, causal links, versions, and
context()'s loads. Tenant scope through scope_clause / workspace_scope only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause, workspace_scope
from shared.repositories.fragments import FRAGMENT_COLUMNS


async def search_traces(
    conn: asyncpg.Connection, principal: Principal, *, type_: str | None, entity: str | None, keyword: str | None,
    case_id: str | None, session_id: str | None, time_from: datetime | None, time_to: datetime | None,
    workspace: str | None, limit: int,
) -> list[asyncpg.Record]:
    params = SqlParams()
    where = [scope_clause(principal.reads, params), workspace_scope(workspace, params)]
    if type_:
        where.append(f"f.type = {params.add(type_)}")
    if entity:
        where.append(f"f.topic ILIKE '%' || {params.add(entity)} || '%'")
    if keyword:
        where.append(f"f.content ILIKE '%' || {params.add(keyword)} || '%'")
    if case_id:
        where.append(f"f.case_id = {params.add(case_id)}")
    if session_id:
        where.append(f"f.session_id = {params.add(session_id)}")
    if time_from:
        where.append(f"f.created_at >= {params.add(time_from)}")
    if time_to:
        where.append(f"f.created_at <= {params.add(time_to)}")
    sql = f"""
        SELECT {FRAGMENT_COLUMNS} FROM fragments f WHERE {' AND '.join(where)}
        ORDER BY f.created_at DESC, f.seq DESC LIMIT {params.add(limit)}
    """
    return await conn.fetch(sql, *params.values)


async def timeline(
    conn: asyncpg.Connection, principal: Principal, *, case_id: str | None, entity: str | None, query: str | None,
    time_from: datetime | None, time_to: datetime | None, workspace: str | None, limit: int,
) -> list[asyncpg.Record]:
    params = SqlParams()
    where = [scope_clause(principal.reads, params), workspace_scope(workspace, params)]
    if case_id:
        where.append(f"f.case_id = {params.add(case_id)}")
    elif entity:
        e = params.add(entity)
        where.append(f"(f.topic ILIKE '%' || {e} || '%' OR {e} = ANY(f.keywords))")
    if query:
        q = params.add(query)
        where.append(f"(f.content ILIKE '%' || {q} || '%' OR f.search_tsv @@ plainto_tsquery('english', {q}))")
    if time_from:
        where.append(f"f.created_at >= {params.add(time_from)}")
    if time_to:
        where.append(f"f.created_at <= {params.add(time_to)}")
    sql = f"""
        SELECT * FROM (
            SELECT {FRAGMENT_COLUMNS} FROM fragments f WHERE {' AND '.join(where)}
            ORDER BY f.created_at DESC, f.seq DESC LIMIT {params.add(limit)}
        ) t ORDER BY t.created_at, t.seq
    """
    return await conn.fetch(sql, *params.values)


async def links_among(conn: asyncpg.Connection, ids: list[str]) -> list[asyncpg.Record]:
    if not ids:
        return []
    return await conn.fetch(
        """
        SELECT from_id, to_id, relation_type, weight FROM fragment_links
        WHERE from_id = ANY($1::text[]) AND to_id = ANY($1::text[]) AND relation_type <> 'co_retrieved'
        """,
        ids,
    )


async def case_events(conn: asyncpg.Connection, principal: Principal, case_id: str) -> list[asyncpg.Record]:
    params = SqlParams()
    scope = scope_clause(principal.reads, params, "e")
    return await conn.fetch(
        f"SELECT e.id, e.event_type, e.summary, e.fragment_id, e.created_at FROM case_events e "
        f"WHERE e.case_id = {params.add(case_id)} AND {scope} ORDER BY e.created_at, e.id",
        *params.values,
    )


async def fragment(conn: asyncpg.Connection, principal: Principal, fragment_id: str) -> asyncpg.Record | None:
    params = SqlParams()
    return await conn.fetchrow(
        f"SELECT {FRAGMENT_COLUMNS} FROM fragments f WHERE f.id = {params.add(fragment_id)} AND {scope_clause(principal.reads, params)}",
        *params.values,
    )


async def causal_neighbours(conn: asyncpg.Connection, principal: Principal, fragment_id: str) -> list[asyncpg.Record]:
    """caused_by / resolved_by links of one fragment, either direction, to readable fragments."""
    params = SqlParams()
    fid = params.add(fragment_id)
    scope = scope_clause(principal.reads, params)
    return await conn.fetch(
        f"""
        SELECT x.relation_type, x.direction, x.weight, {FRAGMENT_COLUMNS} FROM (
            SELECT to_id AS other, relation_type, weight, 'out' AS direction FROM fragment_links
            WHERE from_id = {fid} AND relation_type IN ('caused_by', 'resolved_by')
            UNION ALL
            SELECT from_id, relation_type, weight, 'in' FROM fragment_links
            WHERE to_id = {fid} AND relation_type IN ('caused_by', 'resolved_by')
        ) x JOIN fragments f ON f.id = x.other
        WHERE {scope}
        ORDER BY x.relation_type, f.created_at
        """,
        *params.values,
    )


async def versions(conn: asyncpg.Connection, fragment_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT version, content, topic, type, keywords, importance, changed_by, created_at "
        "FROM fragment_versions WHERE fragment_id = $1 ORDER BY version",
        fragment_id,
    )


async def supersession_chain(
    conn: asyncpg.Connection, principal: Principal, fragment_id: str, limit: int = 50
) -> dict[str, list[asyncpg.Record]]:
    """What this fragment replaced (older, via superseded_by pointing at it) and what replaced it."""
    params = SqlParams()
    fid = params.add(fragment_id)
    scope = scope_clause(principal.reads, params)
    lim = params.add(limit)
    newer = await conn.fetch(
        f"""
        WITH RECURSIVE chain(id, depth) AS (
            SELECT f.superseded_by, 1 FROM fragments f WHERE f.id = {fid} AND f.superseded_by IS NOT NULL
            UNION
            SELECT f.superseded_by, c.depth + 1 FROM chain c JOIN fragments f ON f.id = c.id
            WHERE f.superseded_by IS NOT NULL AND c.depth < {lim}
        )
        SELECT c.depth, {FRAGMENT_COLUMNS} FROM chain c JOIN fragments f ON f.id = c.id WHERE {scope} ORDER BY c.depth
        """,
        *params.values,
    )
    params2 = SqlParams()
    fid2 = params2.add(fragment_id)
    scope2 = scope_clause(principal.reads, params2)
    older = await conn.fetch(
        f"""
        SELECT {FRAGMENT_COLUMNS} FROM fragments f
        WHERE (f.superseded_by = {fid2} OR f.id IN (
            SELECT l.to_id FROM fragment_links l WHERE l.from_id = {fid2} AND l.relation_type = 'superseded_by'
            UNION SELECT l.from_id FROM fragment_links l WHERE l.to_id = {fid2} AND l.relation_type = 'superseded_by'
        )) AND f.id <> {fid2} AND {scope2}
        ORDER BY f.created_at
        """,
        *params2.values,
    )
    return {"newer": list(newer), "older": list(older)}


async def core_memory(
    conn: asyncpg.Connection, principal: Principal, *, types: list[str], workspace: str | None, agent_id: str | None, limit: int
) -> list[asyncpg.Record]:
    params = SqlParams()
    where = [scope_clause(principal.reads, params), workspace_scope(workspace, params), "f.valid_to IS NULL", "f.scope = 'permanent'",
             f"f.type = ANY({params.add(types)}::text[])"]
    if agent_id:
        where.append(f"f.agent_id = {params.add(agent_id)}")
    return await conn.fetch(
        f"""
        SELECT {FRAGMENT_COLUMNS} FROM fragments f WHERE {' AND '.join(where)}
        ORDER BY f.is_anchor DESC, f.importance DESC, f.ema_activation DESC, f.created_at DESC
        LIMIT {params.add(limit)}
        """,
        *params.values,
    )


async def session_fragments(
    conn: asyncpg.Connection, principal: Principal, *, session_id: str, reflect_topic: str, limit: int
) -> dict[str, list[asyncpg.Record]]:
    """Working memory (scope=session) and the session's reflections."""
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    sid = params.add(session_id)
    rows = await conn.fetch(
        f"""
        SELECT {FRAGMENT_COLUMNS} FROM fragments f
        WHERE {scope} AND f.valid_to IS NULL AND (f.session_id = {sid} OR f.session_id LIKE {sid} || '#%')
          AND (f.scope = 'session' OR f.topic = {params.add(reflect_topic)} OR f.source = 'reflect')
        ORDER BY f.created_at DESC, f.seq DESC LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    working = [r for r in rows if r["scope"] == "session"]
    reflections = [r for r in rows if r["scope"] != "session"]
    return {"working": working, "reflections": reflections}


async def unreflected_sessions(conn: asyncpg.Connection, principal: Principal, exclude: str | None) -> int:
    params = SqlParams()
    owner = scope_clause(principal.writes, params, "s")
    ex = f"AND s.id <> {params.add(exclude)}" if exclude else ""
    return int(await conn.fetchval(
        f"SELECT count(*) FROM sessions s WHERE {owner} AND s.ended_at IS NOT NULL AND s.reflected_at IS NULL {ex}",
        *params.values,
    ))


def row_dict(row: asyncpg.Record) -> dict[str, Any]:
    return dict(row)
