"""memory_stats: counts, and the evaluation and workspaces blocks (seed: stats.evaluation,
stats.workspaces). Every aggregate is limited to the keys the caller may read."""

from __future__ import annotations

from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause

OUTCOMES = ("completed", "partial", "blocked", "abandoned", "unknown")
IRRELEVANCE = ("not_stored", "search_miss", "scope_leak", "topic_mismatch", "other")


def _key_scope(principal: Principal, params: SqlParams, column: str) -> str:
    if principal.is_master:
        return "TRUE"
    visible = principal.visible_key_ids or (principal.key_id,)
    return f"{column} = ANY({params.add(list(visible))}::text[])"


def _ratio(num: Any, den: Any) -> float | None:
    return round(float(num) / float(den), 4) if den else None


async def evaluation(conn: asyncpg.Connection, principal: Principal) -> dict[str, Any]:
    params = SqlParams()
    scope = _key_scope(principal, params, "t.key_id")
    # Precision@5 of a rated recall: the rated fragments among its first five results (all
    # five when relevant without fragment_ids, none when irrelevant); per session, then over
    # the latest 100 sessions.
    precision = await conn.fetchrow(
        f"""
        WITH rated AS (
            SELECT coalesce(t.session_id, e.session_id, 'event:' || e.id) AS session, t.created_at,
                   CASE WHEN NOT t.relevant THEN 0.0
                        WHEN t.fragment_ids IS NULL OR cardinality(t.fragment_ids) = 0 THEN 1.0
                        ELSE (SELECT count(*) FROM unnest(e.result_ids[1:5]) r WHERE r = ANY(t.fragment_ids))::float8
                             / greatest(least(5, cardinality(e.result_ids)), 1)
                   END AS p5
            FROM tool_feedback t JOIN search_events e ON e.id = t.search_event_id
            WHERE {scope}
        ), per_session AS (
            SELECT session, avg(p5) AS p5, max(created_at) AS last FROM rated GROUP BY session
            ORDER BY last DESC LIMIT 100
        )
        SELECT avg(p5) AS p5, count(*) AS n FROM per_session
        """,
        *params.values,
    )
    params = SqlParams()
    scope = _key_scope(principal, params, "t.key_id")
    fb = await conn.fetchrow(
        f"""
        SELECT count(*) AS total, count(*) FILTER (WHERE t.sufficient) AS sufficient,
               count(*) FILTER (WHERE NOT t.relevant) AS irrelevant,
               count(*) FILTER (WHERE NOT t.relevant AND t.irrelevance_reason IS NOT NULL) AS reported,
               {', '.join(f"count(*) FILTER (WHERE NOT t.relevant AND t.irrelevance_reason = '{r}') AS {r}" for r in IRRELEVANCE)}
        FROM tool_feedback t WHERE {scope}
        """,
        *params.values,
    )
    params = SqlParams()
    scope = _key_scope(principal, params, "t.key_id")
    task = await conn.fetchrow(
        f"""
        SELECT count(*) AS total, count(*) FILTER (WHERE t.overall_success) AS success,
               count(*) FILTER (WHERE t.outcome IS NOT NULL) AS reported,
               {', '.join(f"count(*) FILTER (WHERE t.outcome = '{o}') AS {o}" for o in OUTCOMES)}
        FROM task_feedback t WHERE {scope} AND t.created_at > now() - interval '30 days'
        """,
        *params.values,
    )
    irrelevant = int(fb["irrelevant"])
    return {
        "rolling_precision_at_5": round(float(precision["p5"]), 4) if precision["p5"] is not None else None,
        "sufficient_rate": _ratio(fb["sufficient"], fb["total"]),
        "sample_sessions": int(precision["n"]),
        "task_success_rate": _ratio(task["success"], task["total"]),
        "task_sessions": int(task["total"]),
        "task_completed_rate": _ratio(task["completed"], task["reported"]),
        "task_outcome_reported": int(task["reported"]),
        "task_outcome_counts": (
            {**{o: int(task[o]) for o in OUTCOMES}, "unreported": int(task["total"]) - int(task["reported"])}
            if task["total"] else None
        ),
        "irrelevance_breakdown": (
            {
                "total_irrelevant": irrelevant,
                "reported": int(fb["reported"]),
                "counts": {**{r: int(fb[r]) for r in IRRELEVANCE}, "unreported": irrelevant - int(fb["reported"])},
            }
            if irrelevant else None
        ),
    }


async def workspaces(conn: asyncpg.Connection, principal: Principal, top: int = 10) -> dict[str, Any]:
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    dist = await conn.fetch(
        f"SELECT f.workspace, count(*) AS n FROM fragments f WHERE {scope} GROUP BY f.workspace ORDER BY n DESC, f.workspace",
        *params.values,
    )
    named = [r for r in dist if r["workspace"] is not None]
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    fill = await conn.fetch(
        f"""
        SELECT f.key_id, k.name AS key_name, count(*) AS total, count(f.workspace) AS with_workspace
        FROM fragments f LEFT JOIN api_keys k ON k.id = f.key_id
        WHERE {scope} GROUP BY f.key_id, k.name ORDER BY total DESC
        """,
        *params.values,
    )
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    sessions = await conn.fetchrow(
        f"""
        WITH per AS (
            SELECT f.session_id, count(*) AS n FROM fragments f
            WHERE {scope} AND f.session_id IS NOT NULL AND f.created_at > now() - interval '30 days'
            GROUP BY f.session_id
        )
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) AS p50,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY n) AS p90, max(n) AS max, count(*) AS sessions
        FROM per
        """,
        *params.values,
    )
    return {
        "distribution": {
            "top": [{"workspace": r["workspace"], "count": r["n"]} for r in named[:top]],
            "null_count": next((r["n"] for r in dist if r["workspace"] is None), 0),
            "distinct_count": len(named),
        },
        "key_fill_rate": [
            {
                "key_id": r["key_id"], "key_name": r["key_name"] if r["key_id"] else "master",
                "total": r["total"], "with_workspace": r["with_workspace"],
                "fill_rate": round(r["with_workspace"] / r["total"], 4) if r["total"] else None,
            }
            for r in fill
        ],
        "session_fragment_distribution": {
            "p50": float(sessions["p50"]) if sessions["p50"] is not None else None,
            "p90": float(sessions["p90"]) if sessions["p90"] is not None else None,
            "max": int(sessions["max"]) if sessions["max"] is not None else None,
            "sample_sessions": int(sessions["sessions"]),
        },
    }
