"""Read-only aggregates for the admin console (seed: /v1/internal/model/nothing/stats,
/activity, /memory/overview, /memory/search-events, /memory/fragments, /memory/graph,
/sessions). Every tenant's rows: these are the master key's views; a key filter goes through
scope_clause like every other tenant filter.

Memory-side views are served by recall (services/recall/admin_views.py); the session and key
counts are read by the gateway from its own pool, as its other admin routes do.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause
from shared.repositories.fragment_transfer import EXPORT_COLUMNS

# Characters of content shown in lists (seed: LEFT(content, 200) in lists, 80 in /activity).
PREVIEW_CHARS = 200
ACTIVITY_PREVIEW_CHARS = 80
# Recall events whose latencies feed searchMetrics (seed: a 100-sample ring per layer).
LATENCY_SAMPLES = 100
# A session (or segment) id named by an admin route matches its segments `{id}#{seq}` too.
SEGMENT_SEPARATOR = "#"


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def key_scope(key_id: str | None) -> TenantScope:
    """A key filter of an admin view: "master" names the master key's own fragments."""
    return TenantScope.key(None if key_id == "master" else key_id)


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def jsonable(row: asyncpg.Record | dict[str, Any]) -> dict[str, Any]:
    return {name: (list(v) if isinstance(v, tuple) else _iso(v)) for name, v in dict(row).items()}


# -- /activity, /memory/overview ------------------------------------------------------------

async def recent_fragments(conn: asyncpg.Connection, limit: int, preview: int) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        """
        SELECT f.id, f.topic, f.type, f.agent_id, f.key_id, f.workspace, f.importance, f.created_at,
               left(f.content, $2) AS preview, k.name AS key_name, k.key_prefix
        FROM fragments f LEFT JOIN api_keys k ON k.id = f.key_id
        ORDER BY f.created_at DESC, f.seq DESC LIMIT $1
        """,
        limit, preview,
    )
    return [jsonable(r) for r in rows]


async def overview(conn: asyncpg.Connection) -> dict[str, Any]:
    counts = await conn.fetchrow(
        """
        SELECT count(*)::int AS total,
               count(*) FILTER (WHERE checked_at IS NULL)::int AS quality_pending,
               count(*) FILTER (WHERE superseded_by IS NOT NULL OR valid_to IS NOT NULL)::int AS superseded,
               count(*) FILTER (WHERE embedding IS NULL)::int AS embedding_backlog
        FROM fragments
        """
    )
    by_type = await conn.fetch("SELECT type, count(*)::int AS count FROM fragments GROUP BY type ORDER BY count DESC, type")
    by_topic = await conn.fetch(
        "SELECT topic, count(*)::int AS count FROM fragments GROUP BY topic ORDER BY count DESC, topic LIMIT 50"
    )
    return {
        "totalFragments": counts["total"],
        "byType": {r["type"]: r["count"] for r in by_type},
        "byTopic": [{"topic": r["topic"], "count": r["count"]} for r in by_topic],
        "qualityPending": counts["quality_pending"],
        "supersededCount": counts["superseded"],
        "embeddingBacklog": counts["embedding_backlog"],
        "recentActivity": await recent_fragments(conn, 10, PREVIEW_CHARS),
    }


async def store_counts(conn: asyncpg.Connection) -> dict[str, Any]:
    """The /stats figures recall answers: fragments, its queues, the database's size."""
    # One pass over fragments for its three counts (three count(*) were three scans: /stats
    # answered in ~350 ms at 100k fragments).
    row = await conn.fetchrow(
        """
        SELECT f.fragments, f.embedding_backlog, f.quality_pending,
               (SELECT count(*) FROM fragment_link_pending)::int AS link_backlog,
               (SELECT count(*) FROM fsck_issues WHERE status = 'open')::int AS fsck_open_issues,
               pg_database_size(current_database()) AS db_size_bytes
        FROM (SELECT count(*)::int AS fragments, count(*) FILTER (WHERE embedding IS NULL)::int AS embedding_backlog,
                     count(*) FILTER (WHERE checked_at IS NULL)::int AS quality_pending
              FROM fragments) f
        """
    )
    return dict(row)


# -- /memory/fragments, a fragment's detail ---------------------------------------------------

async def fragments_page(
    conn: asyncpg.Connection, *, topic: str | None, type_: str | None, key_id: str | None, workspace: str | None,
    page: int, limit: int,
) -> dict[str, Any]:
    params = SqlParams()
    where = ["TRUE"]
    if topic:
        where.append(f"f.topic ILIKE '%' || {params.add(_escape_like(topic))} || '%'")
    if type_:
        where.append(f"f.type = {params.add(type_)}")
    if key_id:
        where.append(scope_clause(key_scope(key_id), params))
    if workspace:
        where.append(f"f.workspace = {params.add(workspace)}")
    clause = " AND ".join(where)
    total = await conn.fetchval(f"SELECT count(*)::int FROM fragments f WHERE {clause}", *params.values)
    rows = await conn.fetch(
        f"""
        SELECT f.id, f.topic, f.type, f.key_id, k.name AS key_name, f.agent_id, f.workspace,
               left(f.content, {params.add(PREVIEW_CHARS)}) AS preview, length(f.content) AS content_length,
               f.importance, f.is_anchor, f.ttl_tier, f.valid_to, f.superseded_by, f.created_at, f.updated_at
        FROM fragments f LEFT JOIN api_keys k ON k.id = f.key_id
        WHERE {clause}
        ORDER BY f.created_at DESC, f.seq DESC
        LIMIT {params.add(limit)} OFFSET {params.add((page - 1) * limit)}
        """,
        *params.values,
    )
    return {"items": [jsonable(r) for r in rows], "total": total, "page": page, "limit": limit}


async def fragment_detail(conn: asyncpg.Connection, fragment_id: str) -> dict[str, Any] | None:
    """A fragment with every field an operator reads (no embedding) and all its links, with
    the fragment at the other end named and previewed."""
    row = await conn.fetchrow(
        """
        SELECT f.id, f.content, f.topic, f.type, f.keywords, f.importance, f.source, f.scope, f.is_anchor,
               f.valid_from, f.valid_to, f.superseded_by, f.ttl_tier, f.ema_activation, f.access_count,
               f.last_accessed_at, f.key_id, k.name AS key_name, f.workspace, f.workspace_source, f.agent_id,
               f.session_id, f.case_id, f.goal, f.outcome, f.phase, f.resolution_status, f.assertion_status,
               f.affect, f.context_summary, f.created_at, f.updated_at, f.checked_at,
               (f.embedding IS NOT NULL) AS has_embedding
        FROM fragments f LEFT JOIN api_keys k ON k.id = f.key_id WHERE f.id = $1
        """,
        fragment_id,
    )
    if row is None:
        return None
    links = await conn.fetch(
        """
        SELECT l.relation_type, l.weight, l.created_at, 'out' AS direction, o.id, o.type, o.topic,
               left(o.content, $2) AS preview
        FROM fragment_links l JOIN fragments o ON o.id = l.to_id WHERE l.from_id = $1
        UNION ALL
        SELECT l.relation_type, l.weight, l.created_at, 'in' AS direction, o.id, o.type, o.topic,
               left(o.content, $2) AS preview
        FROM fragment_links l JOIN fragments o ON o.id = l.from_id WHERE l.to_id = $1
        ORDER BY created_at DESC LIMIT 500
        """,
        fragment_id, PREVIEW_CHARS,
    )
    return {"fragment": jsonable(row), "links": [jsonable(r) for r in links]}


# -- /memory/graph ------------------------------------------------------------------------------

async def graph(conn: asyncpg.Connection, *, topic: str | None, key_id: str | None, limit: int) -> dict[str, Any]:
    """The most important current fragments (of a topic, of a key) and the links among them."""
    params = SqlParams()
    where = ["f.valid_to IS NULL"]
    if topic:
        where.append(f"f.topic = {params.add(topic)}")
    if key_id:
        where.append(scope_clause(key_scope(key_id), params))
    nodes = await conn.fetch(
        f"""
        SELECT f.id, f.content, f.topic, f.type, f.importance, f.key_id, f.workspace, f.created_at,
               f.context_summary, f.session_id, f.ema_activation, f.access_count, f.last_accessed_at
        FROM fragments f WHERE {' AND '.join(where)}
        ORDER BY f.importance DESC, f.created_at DESC, f.id LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    ids = [r["id"] for r in nodes]
    edges = await conn.fetch(
        """
        SELECT from_id, to_id, relation_type, weight FROM fragment_links
        WHERE from_id = ANY($1::text[]) AND to_id = ANY($1::text[])
        ORDER BY from_id, to_id, relation_type
        """,
        ids,
    ) if ids else []
    return {
        "nodes": [
            {
                "id": r["id"], "label": r["content"][:60], "content": r["content"][:300], "topic": r["topic"],
                "type": r["type"], "importance": round(float(r["importance"]), 4), "key_id": r["key_id"],
                "workspace": r["workspace"], "ema_activation": round(float(r["ema_activation"]), 4),
                "access_count": r["access_count"], "accessed_at": _iso(r["last_accessed_at"]),
                "created_at": _iso(r["created_at"]), "context_summary": r["context_summary"],
                "session_id": r["session_id"],
            }
            for r in nodes
        ],
        "edges": [{**dict(r), "weight": round(float(r["weight"]), 4)} for r in edges],
    }


# -- /memory/search-events, searchMetrics, observability ----------------------------------------

# A search path without its counts ("L2:5 → L3:4" -> "L2 → L3"): a bounded set of shapes.
_PATH_SHAPE = r"regexp_replace(coalesce(search_path, ''), ':[^ ]*', '', 'g')"


async def search_events(conn: asyncpg.Connection, days: int) -> dict[str, Any]:
    since = "created_at > now() - make_interval(days => $1)"
    summary = await conn.fetchrow(
        f"""
        SELECT count(*)::int AS total, count(*) FILTER (WHERE result_count = 0)::int AS zero,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY latency_ms) AS p90,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) AS p99,
               avg(latency_ms) AS avg_ms
        FROM search_events WHERE query_type <> 'pending' AND {since}
        """,
        days,
    )
    failed = await conn.fetch(
        f"""
        SELECT id, key_id, session_id, query_type, query_text, keywords, result_count, latency_ms, search_path, created_at
        FROM search_events WHERE query_type <> 'pending' AND result_count = 0 AND {since}
        ORDER BY created_at DESC, id DESC LIMIT 10
        """,
        days,
    )
    feedback = await conn.fetchrow(
        f"""
        SELECT count(*)::int AS total, count(*) FILTER (WHERE relevant)::int AS relevant,
               count(*) FILTER (WHERE sufficient)::int AS sufficient
        FROM tool_feedback WHERE {since}
        """,
        days,
    )
    paths = await conn.fetch(
        f"""
        SELECT {_PATH_SHAPE} AS search_path, count(*)::int AS cnt FROM search_events
        WHERE query_type <> 'pending' AND {since} GROUP BY 1 ORDER BY cnt DESC, 1 LIMIT 20
        """,
        days,
    )
    keywords = await conn.fetch(
        f"""
        SELECT kw, count(*)::int AS cnt FROM search_events, unnest(keywords) AS kw
        WHERE keywords IS NOT NULL AND {since} GROUP BY kw ORDER BY cnt DESC, kw LIMIT 10
        """,
        days,
    )
    total = summary["total"]
    fb_total = feedback["total"]

    def rounded(value: Any) -> float | None:
        return round(float(value), 2) if value is not None else None

    return {
        "days": days,
        "totalSearches": total,
        "avgRelevance": round(feedback["relevant"] / fb_total, 4) if fb_total else None,
        "avgSufficiency": round(feedback["sufficient"] / fb_total, 4) if fb_total else None,
        "feedbackCount": fb_total,
        "failedQueries": [jsonable(r) for r in failed],
        "pathDistribution": [dict(r) for r in paths],
        "latency": {"p50": rounded(summary["p50"]), "p90": rounded(summary["p90"]), "p99": rounded(summary["p99"]),
                    "avg_ms": rounded(summary["avg_ms"])},
        "topKeywords": [dict(r) for r in keywords],
        "zeroResultRate": round(summary["zero"] / total, 4) if total else None,
    }


async def latency_samples(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """The latest recall events: their latency and path (searchMetrics' samples)."""
    return await conn.fetch(
        """
        SELECT latency_ms, coalesce(search_path, '') AS search_path FROM search_events
        WHERE query_type NOT IN ('pending', 'context') AND latency_ms IS NOT NULL
        ORDER BY created_at DESC, id DESC LIMIT $1
        """,
        LATENCY_SAMPLES,
    )


async def observability(conn: asyncpg.Connection, days: int) -> dict[str, Any]:
    since = "se.created_at > now() - make_interval(days => $1)"
    row = await conn.fetchrow(
        f"""
        SELECT count(*)::int AS total,
               count(*) FILTER (WHERE se.search_path LIKE 'L1%')::int AS l1_hits,
               count(*) FILTER (WHERE se.search_path ~ '(^| )L3(kw)?:')::int AS l3_used,
               count(*) FILTER (WHERE se.search_path LIKE '%RM3:%')::int AS rm3_used,
               avg(se.result_count)::real AS avg_result_count, avg(se.latency_ms)::real AS avg_latency_ms
        FROM search_events se WHERE se.query_type NOT IN ('pending', 'context') AND {since}
        """,
        days,
    )
    relevance = await conn.fetch(
        f"""
        SELECT se.query_type, count(DISTINCT se.id)::int AS search_count, count(tf.id)::int AS feedback_count,
               count(tf.id) FILTER (WHERE tf.relevant)::int AS relevant_count,
               count(tf.id) FILTER (WHERE tf.sufficient)::int AS sufficient_count
        FROM search_events se LEFT JOIN tool_feedback tf ON tf.search_event_id = se.id
        WHERE se.query_type <> 'pending' AND {since}
        GROUP BY se.query_type ORDER BY search_count DESC, se.query_type
        """,
        days,
    )
    filters = await conn.fetch(
        f"""
        SELECT k AS filter_key, count(*)::int AS usage_count
        FROM search_events se, jsonb_object_keys(CASE WHEN jsonb_typeof(se.filters) = 'object' THEN se.filters ELSE '{{}}' END) AS k
        WHERE se.query_type NOT IN ('pending', 'context') AND {since}
        GROUP BY k ORDER BY usage_count DESC, k LIMIT 30
        """,
        days,
    )
    total = row["total"]

    def rate(n: int) -> float | None:
        return round(n / total, 4) if total else None

    return {
        "window_days": days,
        "total_searches": total,
        "l1_miss_rate": rate(total - row["l1_hits"]),
        "l3_usage_rate": rate(row["l3_used"]),
        "rm3_usage_rate": rate(row["rm3_used"]),
        "avg_result_count": round(float(row["avg_result_count"]), 1) if row["avg_result_count"] is not None else None,
        "avg_latency_ms": round(float(row["avg_latency_ms"]), 1) if row["avg_latency_ms"] is not None else None,
        "path_relevance": [dict(r) for r in relevance],
        "filter_distribution": [dict(r) for r in filters],
    }


async def session_events(conn: asyncpg.Connection, session_id: str, limit: int) -> dict[str, Any]:
    """A session's (or segment's) search events and tool feedback, newest first."""
    family = _escape_like(session_id) + SEGMENT_SEPARATOR + "%"
    searches = await conn.fetch(
        """
        SELECT id, session_id, query_type, query_text, keywords, result_count, latency_ms, search_path, created_at
        FROM search_events WHERE query_type <> 'pending' AND (session_id = $1 OR session_id LIKE $2)
        ORDER BY created_at DESC, id DESC LIMIT $3
        """,
        session_id, family, limit,
    )
    feedback = await conn.fetch(
        """
        SELECT id, session_id, tool_name, relevant, sufficient, suggestion, context, trigger_type,
               irrelevance_reason, search_event_id, created_at
        FROM tool_feedback WHERE session_id = $1 OR session_id LIKE $2
        ORDER BY created_at DESC, id DESC LIMIT $3
        """,
        session_id, family, limit,
    )
    fragments = await conn.fetchval(
        "SELECT count(*)::int FROM fragments WHERE session_id = $1 OR session_id LIKE $2", session_id, family
    )
    return {
        "searchEvents": [jsonable(r) for r in searches],
        "toolFeedback": [jsonable(r) for r in feedback],
        "fragmentCount": fragments,
    }


# -- the gateway's side: keys, calls, sessions ----------------------------------------------------

async def gateway_counts(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow(
        """
        SELECT (SELECT count(*) FROM api_keys WHERE status = 'active')::int AS active_keys,
               (SELECT count(*) FROM api_keys)::int AS keys,
               (SELECT coalesce(sum(calls), 0) FROM api_key_daily_usage
                 WHERE day = (now() AT TIME ZONE 'UTC')::date)::bigint AS calls_today,
               (SELECT count(DISTINCT transport_id) FROM sessions WHERE ended_at IS NULL)::int AS open_sessions,
               (SELECT count(*) FROM job_outbox)::int AS job_outbox,
               (SELECT status FROM maintenance_runs WHERE job = 'consolidate'
                 ORDER BY started_at DESC LIMIT 1) AS last_consolidation_status
        """
    )
    return dict(row)


async def unreflected_count(conn: asyncpg.Connection, max_attempts: int) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM sessions WHERE ended_at IS NOT NULL AND reflected_at IS NULL AND reflect_attempts < $1",
            max_attempts,
        )
    )


_SESSION_COLUMNS = """
    s.id, s.transport_id, s.key_id, k.name AS key_name, s.workspace, s.mode, s.seq, s.started_at,
    s.last_activity_at, s.ended_at, s.end_reason, s.reflected_at, s.reflect_error, s.previous_id, s.activity
"""


async def session_segments(conn: asyncpg.Connection, *, status: str, limit: int) -> list[asyncpg.Record]:
    """Every segment row of the latest `limit` logical sessions (by transport id): open ones
    ("active"), ended ones, or all."""
    having = {"active": "bool_or(ended_at IS NULL)", "ended": "NOT bool_or(ended_at IS NULL)", "all": "TRUE"}[status]
    return await conn.fetch(
        f"""
        WITH chosen AS (
            SELECT transport_id, max(last_activity_at) AS last FROM sessions
            WHERE transport_id IS NOT NULL GROUP BY transport_id HAVING {having}
            ORDER BY last DESC LIMIT $1
        )
        SELECT {_SESSION_COLUMNS} FROM sessions s JOIN chosen c ON c.transport_id = s.transport_id
        LEFT JOIN api_keys k ON k.id = s.key_id
        ORDER BY c.last DESC, s.transport_id, s.seq, s.started_at
        """,
        limit,
    )


async def session_rows(conn: asyncpg.Connection, session_id: str) -> list[asyncpg.Record]:
    """The segment rows a session id names: a segment itself, or every segment of a logical
    session (its transport id), in order."""
    return await conn.fetch(
        f"""
        SELECT {_SESSION_COLUMNS} FROM sessions s LEFT JOIN api_keys k ON k.id = s.key_id
        WHERE s.id = $1 OR s.transport_id = $1 ORDER BY s.seq, s.started_at
        """,
        session_id,
    )


async def end_session_rows(conn: asyncpg.Connection, session_id: str, reason: str) -> list[str]:
    """End the open rows a session id names; their ids (reflect picks them up when ended)."""
    rows = await conn.fetch(
        """
        UPDATE sessions SET ended_at = now(), end_reason = $2
        WHERE (id = $1 OR transport_id = $1) AND ended_at IS NULL RETURNING id
        """,
        session_id, reason,
    )
    return [r["id"] for r in rows]


async def end_stale_sessions(conn: asyncpg.Connection, idle_seconds: float, reason: str) -> list[str]:
    """End open rows nobody used for `idle_seconds` (a gateway that died left them open)."""
    rows = await conn.fetch(
        """
        UPDATE sessions SET ended_at = now(), end_reason = $2
        WHERE ended_at IS NULL AND last_activity_at < now() - make_interval(secs => $1) RETURNING id
        """,
        idle_seconds, reason,
    )
    return [r["id"] for r in rows]


# -- paged export (the CLI's resumable export) ---------------------------------------------------

async def export_page(
    conn: asyncpg.Connection, *, key_id: str | None, topic: str | None, after: tuple[Any, str] | None, limit: int,
) -> tuple[list[dict[str, Any]], tuple[Any, str] | None]:
    """One page of the export's rows, oldest first (created_at, id: the streamed export's
    order), after the keyset `after`; and the keyset of the page's last row."""
    params = SqlParams()
    clauses = [scope_clause(TenantScope(everyone=True) if key_id is None else key_scope(key_id), params, None)]
    if topic is not None:
        clauses.append(f"topic = {params.add(topic)}")
    if after is not None:
        # The plain bound lets the created_at index start its scan at the cursor. Measured on
        # 100k fragments, pages of 1000: the whole export in 8.4-11.0 s, slowest page ~400 ms
        # (the streamed GET /export: 11.8-12.6 s); with the row comparison alone 12.6 s, 675 ms.
        stamp = params.add(after[0])
        clauses.append(f"created_at >= {stamp}::timestamptz AND (created_at, id) > ({stamp}::timestamptz, {params.add(after[1])})")
    rows = await conn.fetch(
        f"""SELECT {', '.join(EXPORT_COLUMNS)} FROM fragments WHERE {' AND '.join(clauses)}
            ORDER BY created_at, id LIMIT {params.add(limit)}""",
        *params.values,
    )
    items = [{name: _iso(r[name]) if name != "keywords" else list(r[name]) for name in EXPORT_COLUMNS} for r in rows]
    return items, ((rows[-1]["created_at"], rows[-1]["id"]) if rows else None)


async def export_count(conn: asyncpg.Connection, *, key_id: str | None, topic: str | None) -> int:
    params = SqlParams()
    clauses = [scope_clause(TenantScope(everyone=True) if key_id is None else key_scope(key_id), params, None)]
    if topic is not None:
        clauses.append(f"topic = {params.add(topic)}")
    return int(await conn.fetchval(f"SELECT count(*) FROM fragments WHERE {' AND '.join(clauses)}", *params.values))
