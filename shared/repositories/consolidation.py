"""The SQL of the consolidation stages. Every statement is scoped by a Tenant, and every
statement that relates two fragments also requires the same key_id on both sides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import numpy as np

from shared.domain import lifecycle as lc
from shared.domain.principal import SqlParams, same_tenant, scope_clause
from shared.repositories import fragments as fragments_repo
from shared.repositories.maintenance import Tenant


def _count(status: str) -> int:
    return int(status.split()[-1])


# Rows one UPDATE statement rewrites: at 1-3 ms a non-HOT row (HNSW insert) 2000 rows stay
# well inside the pool's 30 s command timeout; a stage loops over chunks up to its limit.
WRITE_CHUNK = 2000


async def _in_chunks(step: Callable[[int], Awaitable[int]], limit: int) -> int:
    done = 0
    while done < limit:
        size = min(WRITE_CHUNK, limit - done)
        n = await step(size)
        done += n
        if n < size:
            break
    return done


async def transition_tiers(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    by_tier: dict[str, int] = {}

    async def step(size: int) -> int:
        params = SqlParams()
        scope = scope_clause(tenant.scope, params)
        hot_window, min_access, hot_imp = params.add(lc.HOT_WINDOW), params.add(lc.HOT_MIN_ACCESS), params.add(lc.HOT_MIN_IMPORTANCE)
        cold_after, cold_imp = params.add(lc.COLD_AFTER), params.add(lc.COLD_MAX_IMPORTANCE)
        rows = await conn.fetch(
            f"""
            WITH target AS (
                SELECT f.id, f.ttl_tier AS old_tier, CASE
                    WHEN f.is_anchor OR f.ttl_tier = 'permanent' THEN 'permanent'
                    WHEN (f.last_accessed_at >= now() - {hot_window}::interval AND f.access_count >= {min_access})
                         OR f.importance >= {hot_imp} THEN 'hot'
                    WHEN coalesce(f.last_accessed_at, f.created_at) < now() - {cold_after}::interval
                         AND f.importance < {cold_imp} THEN 'cold'
                    ELSE 'warm' END AS tier
                FROM fragments f WHERE {scope}
            ), changed AS (
                SELECT id, tier FROM target WHERE tier <> old_tier LIMIT {params.add(size)}
            )
            UPDATE fragments f SET ttl_tier = c.tier FROM changed c WHERE f.id = c.id
            RETURNING c.tier
            """,
            *params.values,
        )
        for r in rows:
            by_tier[r["tier"]] = by_tier.get(r["tier"], 0) + 1
        return len(rows)

    return {"processed": await _in_chunks(step, limit), "toTier": by_tier}


async def decay_importance(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    """Half-life decay from last_decay_at; anchors exempt; stamps last_decay_at."""

    async def step(size: int) -> int:
        return await _decay_chunk(conn, tenant, size)

    return {"processed": await _in_chunks(step, limit)}


async def _decay_chunk(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> int:
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    floor, step = params.add(lc.IMPORTANCE_FLOOR), params.add(lc.MIN_DECAY_STEP)
    status = await conn.execute(
        f"""
        WITH due AS (
            SELECT f.id FROM fragments f
            WHERE {scope} AND NOT f.is_anchor AND f.importance > {floor}
              AND coalesce(f.last_decay_at, f.created_at) < now() - {step}::interval
              -- Only rows whose importance drops by at least MIN_DECAY_DELTA: decay counts from
              -- last_decay_at, so a skipped small step is not lost, and a steady-state cycle
              -- rewrites a few percent of the table instead of all of it.
              AND f.importance * (1 - power(0.5,
                    extract(epoch FROM now() - coalesce(f.last_decay_at, f.created_at)) / 86400.0
                    / {lc.half_life_case_sql('f')})) >= {params.add(lc.MIN_DECAY_DELTA)}
            ORDER BY coalesce(f.last_decay_at, f.created_at)
            LIMIT {params.add(limit)}
        )
        UPDATE fragments f SET
            importance = greatest({floor}, f.importance * power(0.5,
                extract(epoch FROM now() - coalesce(f.last_decay_at, f.created_at)) / 86400.0
                / {lc.half_life_case_sql('f')})),
            last_decay_at = now()
        FROM due WHERE f.id = due.id
        """,
        *params.values,
    )
    return _count(status)


async def collect_garbage(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    utility = lc.utility_sql("f")
    rows = await conn.fetch(
        f"""
        DELETE FROM fragments d WHERE d.id IN (
            SELECT f.id FROM fragments f
            WHERE {scope} AND f.ttl_tier = 'cold' AND NOT f.is_anchor
              AND coalesce(f.last_accessed_at, f.created_at) < now() - {params.add(lc.GC_GRACE)}::interval
              AND {utility} < {params.add(lc.GC_MAX_UTILITY)}
            ORDER BY {utility}
            LIMIT {params.add(limit)}
        )
        RETURNING d.id
        """,
        *params.values,
    )
    return {"processed": len(rows), "deleted": [r["id"] for r in rows[:20]]}


async def exact_duplicate_pairs(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> list[tuple[str, str]]:
    """(removed, survivor): live fragments with the same content in the same tenant and workspace."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    rows = await conn.fetch(
        f"""
        WITH dup AS (
            SELECT f.key_id, f.workspace, f.content_hash FROM fragments f
            WHERE {scope} AND f.valid_to IS NULL
            GROUP BY 1, 2, 3 HAVING count(*) > 1
        ), ranked AS (
            SELECT f.id, f.is_anchor,
                   first_value(f.id) OVER w AS survivor, row_number() OVER w AS rn
            FROM fragments f
            JOIN dup ON {same_tenant('f', 'dup')}
                    AND f.workspace IS NOT DISTINCT FROM dup.workspace AND f.content_hash = dup.content_hash
            WHERE f.valid_to IS NULL
            WINDOW w AS (PARTITION BY f.key_id, f.workspace, f.content_hash
                         ORDER BY f.is_anchor DESC, f.importance DESC, f.created_at, f.id)
        )
        SELECT id, survivor FROM ranked WHERE rn > 1 AND NOT is_anchor LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [(r["id"], r["survivor"]) for r in rows]


async def merge_into(conn: asyncpg.Connection, pairs: list[tuple[str, str]]) -> int:
    """Fold each removed fragment into its survivor: the survivor keeps the higher importance,
    the summed use and the union of keywords; the removed one is superseded (valid_to,
    superseded_by and a superseded_by link), so history and links survive. Pairs of two
    different keys are refused here too, whatever the caller computed."""
    if not pairs:
        return 0
    removed = [p[0] for p in pairs]
    survivors = [p[1] for p in pairs]
    rows = await conn.fetch(
        f"""
        WITH p AS (SELECT * FROM unnest($1::text[], $2::text[]) AS p(removed, survivor)),
        ok AS (
            SELECT p.removed, p.survivor, r.key_id, r.importance, r.access_count, r.keywords
            FROM p JOIN fragments r ON r.id = p.removed JOIN fragments s ON s.id = p.survivor
            WHERE {same_tenant('r', 's')} AND r.valid_to IS NULL AND s.valid_to IS NULL
              AND NOT r.is_anchor
        ), gone AS (
            UPDATE fragments f SET valid_to = now(), superseded_by = ok.survivor, updated_at = now()
            FROM ok WHERE f.id = ok.removed
            RETURNING ok.removed, ok.survivor
        ), folded AS (
            SELECT survivor, max(importance) AS importance, sum(access_count) AS access_count,
                   array_agg(DISTINCT k) FILTER (WHERE k IS NOT NULL) AS keywords
            FROM ok LEFT JOIN LATERAL unnest(ok.keywords) AS k ON TRUE GROUP BY survivor
        ), grown AS (
            UPDATE fragments s SET
                importance = greatest(s.importance, folded.importance),
                access_count = s.access_count + folded.access_count,
                keywords = ARRAY(SELECT DISTINCT x FROM unnest(s.keywords || coalesce(folded.keywords, '{{}}')) x)
            FROM folded WHERE s.id = folded.survivor
            RETURNING s.id
        ), linked AS (
            INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
            SELECT ok.removed, ok.survivor, 'superseded_by', 1, ok.key_id FROM ok
            ON CONFLICT DO NOTHING
            RETURNING from_id
        )
        SELECT (SELECT count(*) FROM gone) AS merged, (SELECT count(*) FROM grown) AS grown, (SELECT count(*) FROM linked) AS linked
        """,
        removed, survivors,
    )
    return int(rows[0]["merged"])


_MARK_JOIN = """
    LEFT JOIN consolidation_marks m
      ON m.key_id = coalesce(f.key_id, '') AND m.workspace = coalesce(f.workspace, '') AND m.topic = f.topic
"""
# Rows this recent stay "new" for one more cycle: a transaction that inserted them may not
# have been committed when the cycle read the group (re-comparing is idempotent).
MARK_LAG = timedelta(minutes=1)


async def unconsolidated_groups(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> list[tuple[str | None, str | None, str]]:
    """(key_id, workspace, topic) groups holding live fragments newer than the group's mark,
    for at most `limit` such fragments, oldest first."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    rows = await conn.fetch(
        f"""
        SELECT DISTINCT key_id, workspace, topic FROM (
            SELECT f.key_id, f.workspace, f.topic FROM fragments f {_MARK_JOIN}
            WHERE {scope} AND f.valid_to IS NULL AND f.embedding IS NOT NULL
              AND (m.upto IS NULL OR f.created_at > m.upto)
            ORDER BY f.created_at LIMIT {params.add(limit)}
        ) s
        """,
        *params.values,
    )
    return [(r["key_id"], r["workspace"], r["topic"]) for r in rows]


async def group_members(conn: asyncpg.Connection, groups: list[tuple[str | None, str | None, str]]) -> list[asyncpg.Record]:
    """Every live, embedded fragment of the given groups; is_new = newer than the group's
    mark (coalesce makes the join hashable)."""
    if not groups:
        return []
    return await conn.fetch(
        f"""
        SELECT f.id, f.key_id, f.workspace, f.topic, f.type, f.content, f.embedding::vector AS embedding, f.is_anchor,
               f.importance, f.access_count, f.created_at, f.session_id, (m.upto IS NULL OR f.created_at > m.upto) AS is_new
        FROM fragments f
        JOIN unnest($1::text[], $2::text[], $3::text[]) AS g(k, w, t)
          ON coalesce(f.key_id, '') = coalesce(g.k, '') AND coalesce(f.workspace, '') = coalesce(g.w, '')
         AND f.topic = g.t
        {_MARK_JOIN}
        WHERE f.valid_to IS NULL AND f.embedding IS NOT NULL
        """,  # no ORDER BY: grouping happens in Python, and sorting 100k vectors spills to disk
        [g[0] for g in groups], [g[1] for g in groups], [g[2] for g in groups],
    )


async def advance_marks(conn: asyncpg.Connection, groups: list[tuple[str | None, str | None, str]]) -> None:
    """Every fragment of these groups up to MARK_LAG ago has been compared."""
    if not groups:
        return
    await conn.execute(
        """
        INSERT INTO consolidation_marks (key_id, workspace, topic, upto)
        SELECT coalesce(k, ''), coalesce(w, ''), t, now() - $4::interval
        FROM unnest($1::text[], $2::text[], $3::text[]) AS g(k, w, t)
        ON CONFLICT (key_id, workspace, topic) DO UPDATE SET upto = greatest(consolidation_marks.upto, EXCLUDED.upto)
        """,
        [g[0] for g in groups], [g[1] for g in groups], [g[2] for g in groups], MARK_LAG,
    )


async def insert_contradictions(conn: asyncpg.Connection, links: list[tuple[str, str, float]]) -> int:
    """contradicts links (newer -> older), only between fragments of one key."""
    if not links:
        return 0
    status = await conn.execute(
        f"""
        INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
        SELECT a.id, b.id, 'contradicts', l.w, a.key_id
        FROM unnest($1::text[], $2::text[], $3::real[]) AS l(a, b, w)
        JOIN fragments a ON a.id = l.a JOIN fragments b ON b.id = l.b
        WHERE {same_tenant('a', 'b')}
        ON CONFLICT DO NOTHING
        """,
        [x[0] for x in links], [x[1] for x in links], [x[2] for x in links],
    )
    return _count(status)


# Types whose later statement replaces an earlier one (a changed decision or taste); a fact
# that conflicts with another stays as a contradiction for a person or agent to settle.
SUPERSEDABLE_TYPES = ("decision", "preference")
SUPERSEDE_MIN_CONFIDENCE = 0.7


async def supersede_contradicted(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    """A newer decision/preference contradicting an older one of the same type, tenant,
    workspace and topic supersedes it (seed: valid_to set, importance halved); plus repair
    of rows whose superseded_by was set without valid_to."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params, "o")
    rows = await conn.fetch(
        f"""
        WITH cand AS (
            SELECT DISTINCT ON (o.id) o.id AS old_id, n.id AS new_id, o.key_id
            FROM fragment_links l
            JOIN fragments n ON n.id = l.from_id JOIN fragments o ON o.id = l.to_id
            WHERE l.relation_type = 'contradicts' AND l.weight >= {params.add(SUPERSEDE_MIN_CONFIDENCE)}
              AND {scope} AND {same_tenant('n', 'o')}
              AND n.type = o.type AND n.type = ANY({params.add(list(SUPERSEDABLE_TYPES))}::text[])
              AND n.workspace IS NOT DISTINCT FROM o.workspace AND n.topic = o.topic
              AND n.created_at > o.created_at AND n.valid_to IS NULL AND o.valid_to IS NULL
              AND NOT o.is_anchor
            ORDER BY o.id, n.created_at DESC
            LIMIT {params.add(limit)}
        ), done AS (
            UPDATE fragments f SET valid_to = now(), superseded_by = cand.new_id,
                                   importance = f.importance / 2, updated_at = now()
            FROM cand WHERE f.id = cand.old_id
            RETURNING cand.old_id, cand.new_id, cand.key_id
        ), linked AS (
            INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
            SELECT old_id, new_id, 'superseded_by', 1, key_id FROM done ON CONFLICT DO NOTHING
        )
        SELECT old_id, new_id FROM done
        """,
        *params.values,
    )
    repair_params = SqlParams()
    repair_scope = scope_clause(tenant.scope, repair_params)
    repaired = await conn.execute(
        f"""
        UPDATE fragments f SET valid_to = coalesce(f.updated_at, now())
        WHERE {repair_scope} AND f.superseded_by IS NOT NULL AND f.valid_to IS NULL
        """,
        *repair_params.values,
    )
    return {
        "processed": len(rows),
        "superseded": [{"id": r["old_id"], "by": r["new_id"]} for r in rows[:20]],
        "repaired": _count(repaired),
    }


async def missing_embeddings(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> list[tuple[str, str | None, str]]:
    """(id, topic, content) of fragments stored without an embedding, oldest first."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    rows = await conn.fetch(
        f"""
        SELECT f.id, f.topic, f.content FROM fragments f
        WHERE {scope} AND f.embedding IS NULL ORDER BY f.created_at LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [(r["id"], r["topic"], r["content"]) for r in rows]


async def store_embeddings(conn: asyncpg.Connection, ids: list[str], vectors: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Each fragment's embedding and passage embeddings (shared.domain.passages.split_vectors)."""
    async with conn.transaction():
        # executemany: the pgvector codec encodes one vector per parameter, not vector[].
        await conn.executemany(
            "UPDATE fragments SET embedding = $2::vector WHERE id = $1 AND embedding IS NULL",
            [(i, v) for i, (v, _) in zip(ids, vectors, strict=True)],
        )
        await fragments_repo.replace_passages(conn, [(i, p) for i, (_, p) in zip(ids, vectors, strict=True)])
    return len(ids)


async def passage_backlog(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> list[tuple[str, str]]:
    """Queued fragments (migration 0012: stored before passages existed) in the tenant."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    rows = await conn.fetch(
        f"""
        SELECT f.id, f.content FROM passage_backfill q JOIN fragments f ON f.id = q.fragment_id
        WHERE {scope} ORDER BY q.fragment_id LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [(r["id"], r["content"]) for r in rows]


async def store_backfilled_passages(conn: asyncpg.Connection, items: list[tuple[str, str, Any]]) -> int:
    """(id, the content embedded, its passage vectors): rows for each fragment whose content
    is still that content and that has no passages yet; every item leaves the queue. The
    fragments are locked FOR SHARE: an amend that commits first changes the content (its own
    passages win; the recheck drops ours), one that comes later waits for this transaction
    and replaces ours. Returns how many fragments got passages."""
    ids, ordinals, vectors = fragments_repo.passage_columns([(i, p) for i, _, p in items])
    async with conn.transaction():
        stored = await conn.fetch(
            """
            WITH live AS (
                SELECT f.id, f.key_id FROM fragments f
                JOIN unnest($1::text[], $2::text[]) AS u (id, content) ON f.id = u.id AND f.content = u.content
                WHERE NOT EXISTS (SELECT 1 FROM fragment_passages p WHERE p.fragment_id = f.id)
                FOR SHARE OF f
            )
            INSERT INTO fragment_passages (fragment_id, key_id, ordinal, embedding)
            SELECT v.id, live.key_id, v.ordinal, v.embedding
            FROM unnest($3::text[], $4::smallint[], $5::vector[]) AS v (id, ordinal, embedding) JOIN live ON live.id = v.id
            ON CONFLICT DO NOTHING
            RETURNING fragment_id
            """,
            [i for i, _, _ in items], [c for _, c, _ in items], ids, ordinals, vectors,
        )
        await conn.execute("DELETE FROM passage_backfill WHERE fragment_id = ANY($1::text[])", [i for i, _, _ in items])
    return len({r["fragment_id"] for r in stored})


async def decay_activation(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    """ema_activation halves per ACTIVATION_HALF_LIFE_DAYS since the later of the last decay
    and the last access (an access has just refreshed it)."""

    async def step(size: int) -> int:
        return await _activation_chunk(conn, tenant, size)

    return {"processed": await _in_chunks(step, limit)}


async def _activation_chunk(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> int:
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    since = "greatest(coalesce(f.activation_decayed_at, f.created_at), coalesce(f.last_accessed_at, f.created_at))"
    status = await conn.execute(
        f"""
        WITH due AS (
            SELECT f.id FROM fragments f
            WHERE {scope} AND f.ema_activation > 0.001 AND {since} < now() - {params.add(timedelta(hours=1))}::interval
            LIMIT {params.add(limit)}
        )
        UPDATE fragments f SET
            ema_activation = f.ema_activation * power(0.5, extract(epoch FROM now() - {since}) / 86400.0
                                                     / {lc.ACTIVATION_HALF_LIFE_DAYS}),
            activation_decayed_at = now()
        FROM due WHERE f.id = due.id
        """,
        *params.values,
    )
    return _count(status)


# Two fragments returned together (top 5) by at least this many searches are co-retrieved.
CO_RETRIEVAL_MIN_EVENTS = 2
CO_RETRIEVAL_TOP = 5
CO_RETRIEVAL_WINDOW = timedelta(days=7)


async def link_co_retrieved(conn: asyncpg.Connection, tenant: Tenant, limit: int) -> dict[str, Any]:
    """co_retrieved links from recent search events; weight grows with the count. A master
    or group search can return several keys' fragments together: only same-key pairs link."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params, "fa")
    status = await conn.execute(
        f"""
        WITH ev AS (
            SELECT e.result_ids[1:{CO_RETRIEVAL_TOP}] AS ids FROM search_events e
            WHERE e.created_at > now() - {params.add(CO_RETRIEVAL_WINDOW)}::interval AND e.result_count >= 2
            ORDER BY e.id DESC LIMIT {params.add(limit)}
        ), pairs AS (
            SELECT least(a.id, b.id) AS x, greatest(a.id, b.id) AS y, count(*) AS n
            FROM ev, unnest(ev.ids) WITH ORDINALITY a(id, i), unnest(ev.ids) WITH ORDINALITY b(id, j)
            WHERE i < j AND a.id <> b.id
            GROUP BY 1, 2 HAVING count(*) >= {params.add(CO_RETRIEVAL_MIN_EVENTS)}
        )
        INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
        SELECT p.x, p.y, 'co_retrieved', least(1.0, p.n / 10.0)::real, fa.key_id
        FROM pairs p JOIN fragments fa ON fa.id = p.x JOIN fragments fb ON fb.id = p.y
        WHERE {same_tenant('fa', 'fb')} AND {scope}
        ON CONFLICT (from_id, to_id, relation_type) DO UPDATE SET weight = EXCLUDED.weight
        WHERE fragment_links.weight IS DISTINCT FROM EXCLUDED.weight
        """,
        *params.values,
    )
    return {"processed": _count(status)}


SESSION_RETENTION = timedelta(days=30)


async def clean_sessions(conn: asyncpg.Connection, tenant: Tenant, idle_ttl: timedelta, limit: int) -> dict[str, Any]:
    """End sessions idle past idle_ttl (the reflect sweep then reflects them); drop the
    working memory (scope=session fragments) of reflected sessions; delete session rows that
    ended and were reflected (or gave up) more than SESSION_RETENTION ago."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params, "s")
    expired = await conn.execute(
        f"""
        UPDATE sessions s SET ended_at = now(), end_reason = 'expired'
        WHERE s.id IN (
            SELECT s.id FROM sessions s
            WHERE {scope} AND s.ended_at IS NULL AND s.last_activity_at < now() - {params.add(idle_ttl)}::interval
            LIMIT {params.add(limit)}
        )
        """,
        *params.values,
    )
    # seed: scope=session fragments are working memory and go with their session, once the
    # session's reflect has had them (AutoReflect reads them).
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    working = await conn.execute(
        f"""
        DELETE FROM fragments d WHERE d.id IN (
            SELECT f.id FROM fragments f JOIN sessions s ON s.id = f.session_id
            WHERE {scope} AND f.scope = 'session' AND s.ended_at IS NOT NULL
              AND (s.reflected_at IS NOT NULL OR s.reflect_attempts >= 5)
            LIMIT {params.add(limit)}
        )
        """,
        *params.values,
    )
    params = SqlParams()
    scope = scope_clause(tenant.scope, params, "s")
    deleted = await conn.execute(
        f"""
        DELETE FROM sessions d WHERE d.id IN (
            SELECT s.id FROM sessions s
            WHERE {scope} AND s.ended_at < now() - {params.add(SESSION_RETENTION)}::interval
              AND (s.reflected_at IS NOT NULL OR s.reflect_attempts >= 5)
            LIMIT {params.add(limit)}
        )
        """,
        *params.values,
    )
    return {
        "processed": _count(expired) + _count(working) + _count(deleted),
        "expired": _count(expired),
        "workingMemoryDropped": _count(working),
        "deleted": _count(deleted),
    }


async def anomaly_facts(conn: asyncpg.Connection, tenant: Tenant) -> list[asyncpg.Record]:
    """Per key: the numbers the anomaly rules look at."""
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    return await conn.fetch(
        f"""
        SELECT f.key_id,
               count(*) FILTER (WHERE f.valid_to IS NULL) AS live,
               count(*) FILTER (WHERE f.embedding IS NULL) AS no_embedding,
               count(*) FILTER (WHERE f.valid_to IS NULL AND f.importance >= 0.9) AS very_important,
               count(*) FILTER (WHERE f.created_at > now() - interval '1 day') AS last_day,
               count(*) FILTER (WHERE f.created_at > now() - interval '30 days') AS last_30_days,
               count(*) FILTER (WHERE f.valid_to IS NULL AND cardinality(f.keywords) = 0) AS no_keywords,
               (SELECT count(*) FROM fragment_links l JOIN fragments a ON a.id = l.from_id
                  JOIN fragments b ON b.id = l.to_id
                 WHERE l.relation_type = 'contradicts' AND a.valid_to IS NULL AND b.valid_to IS NULL
                   AND {same_tenant('a', 'f')}) AS open_contradictions
        FROM fragments f WHERE {scope}
        GROUP BY f.key_id
        """,
        *params.values,
    )
