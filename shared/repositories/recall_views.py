"""Read-side lookups that decorate recall results: links, key names, surrounding turns,
cases, and the facts behind _meta hints. Every query is scoped by scope_clause."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause

# resolved_by / caused_by first (seed: includeLinks "resolved_by/caused_by 우선").
_RELATION_ORDER = "CASE l.relation_type WHEN 'resolved_by' THEN 0 WHEN 'caused_by' THEN 1 ELSE 2 END"
CAUSAL_RELATIONS = ("caused_by", "resolved_by", "contradicts", "part_of")


async def links_of(
    conn: asyncpg.Connection, principal: Principal, ids: list[str], relation: str | None, per_fragment: int
) -> dict[str, list[dict[str, Any]]]:
    """One hop from each fragment, either direction, to fragments the caller may read."""
    if not ids:
        return {}
    params = SqlParams()
    id_list = params.add(ids)
    scope = scope_clause(principal.reads, params, "o")
    rel = f"AND l.relation_type = {params.add(relation)}" if relation else "AND l.relation_type <> 'co_retrieved'"
    sql = f"""
        SELECT * FROM (
            SELECT x.seed, o.id, o.content, o.type, o.topic, x.relation_type, x.direction, x.weight,
                   row_number() OVER (PARTITION BY x.seed ORDER BY x.ord, x.weight DESC, o.id) AS n
            FROM (
                SELECT l.from_id AS seed, l.to_id AS other, l.relation_type, l.weight, 'out' AS direction,
                       {_RELATION_ORDER} AS ord
                FROM fragment_links l WHERE l.from_id = ANY({id_list}::text[]) {rel}
                UNION ALL
                SELECT l.to_id, l.from_id, l.relation_type, l.weight, 'in', {_RELATION_ORDER}
                FROM fragment_links l WHERE l.to_id = ANY({id_list}::text[]) {rel}
            ) x JOIN fragments o ON o.id = x.other
            WHERE {scope}
        ) t WHERE t.n <= {params.add(per_fragment)}
        ORDER BY t.seed, t.n
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for r in await conn.fetch(sql, *params.values):
        out.setdefault(r["seed"], []).append({
            "id": r["id"], "content": r["content"], "type": r["type"], "topic": r["topic"],
            "relation_type": r["relation_type"], "direction": r["direction"], "weight": round(float(r["weight"]), 4),
        })
    return out


async def key_names(conn: asyncpg.Connection, key_ids: list[str]) -> dict[str, str]:
    if not key_ids:
        return {}
    rows = await conn.fetch("SELECT id, name FROM api_keys WHERE id = ANY($1::text[])", key_ids)
    return {r["id"]: r["name"] for r in rows}


async def surrounding(
    conn: asyncpg.Connection, principal: Principal, ids: list[str], width: int, window_minutes: int | None
) -> dict[str, dict[str, list[asyncpg.Record]]]:
    """Fragments stored just before / after each one in the same session (seq order), within
    window_minutes of it when given."""
    if not ids:
        return {}
    params = SqlParams()
    scope = scope_clause(principal.reads, params, "n")
    id_list = params.add(ids)
    w = params.add(width)
    window = ""
    if window_minutes is not None:
        window = f"AND abs(extract(epoch FROM n.created_at - c.created_at)) <= {params.add(window_minutes * 60)}"
    cols = "n.id, n.content, n.type, n.created_at, n.seq"
    sql = f"""
        SELECT c.id AS target, c.created_at AS target_at, 'pre' AS side, p.* FROM fragments c
        CROSS JOIN LATERAL (SELECT {cols} FROM fragments n
            WHERE n.session_id = c.session_id AND n.seq < c.seq AND n.valid_to IS NULL AND {scope} {window}
            ORDER BY n.seq DESC LIMIT {w}) p
        WHERE c.id = ANY({id_list}::text[]) AND c.session_id IS NOT NULL
        UNION ALL
        SELECT c.id, c.created_at, 'post', p.* FROM fragments c
        CROSS JOIN LATERAL (SELECT {cols} FROM fragments n
            WHERE n.session_id = c.session_id AND n.seq > c.seq AND n.valid_to IS NULL AND {scope} {window}
            ORDER BY n.seq ASC LIMIT {w}) p
        WHERE c.id = ANY({id_list}::text[]) AND c.session_id IS NOT NULL
    """
    out: dict[str, dict[str, list[asyncpg.Record]]] = {}
    for r in await conn.fetch(sql, *params.values):
        out.setdefault(r["target"], {"pre": [], "post": []})[r["side"]].append(r)
    for sides in out.values():
        sides["pre"].sort(key=lambda r: r["seq"])
        sides["post"].sort(key=lambda r: r["seq"])
    return out


async def case_summaries(conn: asyncpg.Connection, principal: Principal, case_ids: list[str]) -> dict[str, dict[str, Any]]:
    """goal / outcome / resolution_status / fragment count per case, and its events in order."""
    if not case_ids:
        return {}
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    ids = params.add(case_ids)
    rows = await conn.fetch(
        f"""
        SELECT f.case_id,
               count(*) AS fragment_count,
               (array_agg(f.goal ORDER BY (f.type = 'episode') DESC, f.created_at) FILTER (WHERE f.goal IS NOT NULL))[1] AS goal,
               (array_agg(f.outcome ORDER BY f.updated_at DESC) FILTER (WHERE f.outcome IS NOT NULL))[1] AS outcome,
               (array_agg(f.resolution_status ORDER BY f.updated_at DESC) FILTER (WHERE f.resolution_status IS NOT NULL))[1] AS status
        FROM fragments f WHERE f.case_id = ANY({ids}::text[]) AND {scope}
        GROUP BY f.case_id
        """,
        *params.values,
    )
    out = {r["case_id"]: {"goal": r["goal"], "outcome": r["outcome"], "resolution_status": r["status"],
                          "fragment_count": r["fragment_count"], "events": []} for r in rows}
    eparams = SqlParams()
    escope = scope_clause(principal.reads, eparams, "e")
    eids = eparams.add(list(out))
    for r in await conn.fetch(
        f"SELECT e.case_id, e.event_type, e.summary, e.created_at FROM case_events e "
        f"WHERE e.case_id = ANY({eids}::text[]) AND {escope} ORDER BY e.created_at, e.id",
        *eparams.values,
    ):
        out[r["case_id"]]["events"].append({"event_type": r["event_type"], "summary": r["summary"]})
    return out


async def similar_topics(conn: asyncpg.Connection, principal: Principal, topic: str, limit: int = 3) -> list[str]:
    """Topics in the caller's scope that look like `topic` (trigram), for topic_mismatch."""
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    t = params.add(topic)
    rows = await conn.fetch(
        f"""
        SELECT f.topic, max(similarity(f.topic, {t})) AS sim FROM fragments f
        WHERE {scope} AND f.valid_to IS NULL AND f.topic <> {t}
          AND (f.topic % {t} OR f.topic ILIKE '%' || {t} || '%' OR {t} ILIKE '%' || f.topic || '%')
        GROUP BY f.topic ORDER BY sim DESC LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [r["topic"] for r in rows]


async def still_fresh(conn: asyncpg.Connection, ids: list[str], cached_at: datetime) -> bool:
    """True when none of these fragments was deleted, amended or superseded since cached_at."""
    if not ids:
        return True
    n = await conn.fetchval(
        "SELECT count(*) FROM fragments WHERE id = ANY($1::text[]) AND updated_at <= $2 "
        "AND (valid_to IS NULL OR valid_to <= $2)",
        ids, cached_at,
    )
    return int(n) == len(set(ids))


async def meta_facts(
    conn: asyncpg.Connection, ids: list[str], event_id: int | None = None,
) -> tuple[int, list[tuple[str, str]], list[str]]:
    """One round trip for _meta: a reserved search event id (unless one was reserved already:
    on a read replica, nextval is refused), the pending contradictions and the open errors
    among the returned fragments."""
    row = await conn.fetchrow(
        """
        SELECT coalesce($2::bigint, nextval(pg_get_serial_sequence('search_events', 'id'))) AS event_id,
          (SELECT array_agg(ARRAY[l.from_id, l.to_id]) FROM fragment_links l
             JOIN fragments a ON a.id = l.from_id JOIN fragments b ON b.id = l.to_id
            WHERE l.relation_type = 'contradicts' AND (l.from_id = ANY($1::text[]) OR l.to_id = ANY($1::text[]))
              AND a.valid_to IS NULL AND b.valid_to IS NULL) AS contradictions,
          (SELECT array_agg(f.id) FROM fragments f
            WHERE f.id = ANY($1::text[]) AND f.type = 'error' AND f.valid_to IS NULL
              AND (f.resolution_status = 'open' OR (f.resolution_status IS NULL AND NOT EXISTS (
                    SELECT 1 FROM fragment_links l WHERE l.relation_type = 'resolved_by'
                      AND (l.from_id = f.id OR l.to_id = f.id))))) AS errors
        """,
        ids, event_id,
    )
    pairs = [(p[0], p[1]) for p in (row["contradictions"] or [])]
    return int(row["event_id"]), pairs, list(row["errors"] or [])


async def latest_seq(conn: asyncpg.Connection, principal: Principal) -> int:
    """The highest insertion number among the fragments the caller can read (index lookups
    per visible key), so a cache entry can tell that something new was stored."""
    if principal.is_master:
        return int(await conn.fetchval("SELECT coalesce(max(seq), 0) FROM fragments") or 0)
    visible = list(principal.visible_key_ids or (principal.key_id,))
    return int(await conn.fetchval(
        "SELECT coalesce(max(x.m), 0) FROM unnest($1::text[]) AS k(id), "
        "LATERAL (SELECT max(f.seq) AS m FROM fragments f WHERE f.key_id = k.id) x",
        visible,
    ) or 0)
