"""Fragments: insert, look up, delete, and the candidate queries of each search layer."""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import numpy as np
from pgvector import Vector

from shared.domain.fragment import NewFragment
from shared.domain.keywords import korean_morphemes
from shared.domain.principal import Principal, SqlParams, TenantScope, scope_clause, workspace_scope
from shared.domain.search import FragmentFilter
from shared.repositories import locks

_HANGUL = re.compile(r"[\uac00-\ud7a3]")

# Columns a recall response can carry.
FRAGMENT_COLUMNS = """
    f.id, f.content, f.topic, f.type, f.keywords, f.importance, f.source, f.scope, f.is_anchor,
    f.valid_from, f.valid_to, f.superseded_by, f.ttl_tier, f.ema_activation, f.access_count,
    f.last_accessed_at, f.key_id, f.workspace, f.workspace_source, f.agent_id, f.session_id,
    f.case_id, f.goal, f.outcome, f.phase, f.resolution_status, f.assertion_status, f.affect,
    f.context_summary, f.created_at, f.updated_at, f.seq
"""

# One statement per batch: rows arrive as parallel arrays (unnest), so the per-statement
# work (the fragment_terms trigger, planning, a round trip) is paid once per batch, not per
# row. Keywords travel as one JSON array per row (a text[][] cannot be ragged).
_INSERT = """
INSERT INTO fragments (
    id, content, topic, type, keywords, importance, source, scope, is_anchor, ttl_tier,
    key_id, workspace, workspace_source, agent_id, session_id, case_id, goal, outcome, phase,
    resolution_status, assertion_status, affect, context_summary, content_hash, embedding,
    valid_from, search_tsv, valid_to, created_at
)
SELECT
    r.id, r.content, r.topic, r.type, k.keywords, r.importance, r.source, r.scope, r.is_anchor, r.ttl_tier,
    r.key_id, r.workspace, r.workspace_source, r.agent_id, r.session_id, r.case_id, r.goal, r.outcome, r.phase,
    r.resolution_status, r.assertion_status, r.affect, r.context_summary, r.content_hash, r.embedding,
    coalesce(r.valid_from, now()),
    setweight(to_tsvector('english', r.content), 'B')
    || setweight(to_tsvector('simple', r.topic || ' ' || array_to_string(k.keywords, ' ')), 'A')
    || setweight(to_tsvector('simple', r.morphemes), 'B'),
    r.valid_to, coalesce(r.created_at, now())
FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::real[], $7::text[], $8::text[], $9::boolean[],
    $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[],
    $18::text[], $19::text[], $20::text[], $21::text[], $22::text[], $23::text[], $24::text[], $25::vector[],
    $26::timestamptz[], $27::text[], $28::timestamptz[], $29::timestamptz[]
) AS r(
    id, content, topic, type, keywords_json, importance, source, scope, is_anchor, ttl_tier,
    key_id, workspace, workspace_source, agent_id, session_id, case_id, goal, outcome, phase,
    resolution_status, assertion_status, affect, context_summary, content_hash, embedding,
    valid_from, morphemes, valid_to, created_at
)
CROSS JOIN LATERAL (SELECT ARRAY(SELECT jsonb_array_elements_text(r.keywords_json::jsonb)) AS keywords) k
"""


def _vector(value: Any) -> Vector | None:
    """An embedding as the codec takes it: a fresh one is an ndarray, one read back from a row
    (a supersede that keeps the content) is a Vector already."""
    return value if value is None or isinstance(value, Vector) else Vector(value)


def _insert_columns(fragments: list[NewFragment]) -> list[list[Any]]:
    rows = [
        (
            f.id, f.content, f.topic, f.type, json.dumps(f.keywords, ensure_ascii=False), f.importance, f.source,
            f.scope, f.is_anchor, f.ttl_tier, f.key_id, f.workspace, f.workspace_source, f.agent_id, f.session_id,
            f.case_id, f.goal, f.outcome, f.phase, f.resolution_status, f.assertion_status, f.affect,
            f.context_summary, f.content_hash, _vector(f.embedding), f.valid_from,
            content_morphemes(f.content),
            # Set only by an admin import, which restores a fragment's history as exported.
            f.extra.get("valid_to"), f.extra.get("created_at"),
        )
        for f in fragments
    ]
    return [list(column) for column in zip(*rows, strict=True)]


def content_morphemes(content: str) -> str:
    """Korean content words for the full-text vector: the english parser keeps "서버가" whole,
    so the morphemes ("서버") are indexed beside it. Empty for text without Hangul."""
    if not _HANGUL.search(content):
        return ""
    return " ".join(korean_morphemes(content) or [])


async def refresh_search_tsv(conn: asyncpg.Connection, fragment_id: str) -> None:
    """Rebuild the full-text vector from the row as it now is, with the insert's weights
    (prose stemmed, topic + keywords exact, Korean morphemes beside the prose)."""
    content = await conn.fetchval("SELECT content FROM fragments WHERE id = $1", fragment_id)
    if content is None:
        return
    await conn.execute(
        """
        UPDATE fragments SET search_tsv = setweight(to_tsvector('english', content), 'B')
            || setweight(to_tsvector('simple', topic || ' ' || array_to_string(keywords, ' ')), 'A')
            || setweight(to_tsvector('simple', $2), 'B')
        WHERE id = $1
        """,
        fragment_id, content_morphemes(content),
    )


async def insert_many(conn: asyncpg.Connection, fragments: list[NewFragment]) -> None:
    if fragments:
        await conn.execute(_INSERT, *_insert_columns(fragments))
        await _insert_passages(conn, [(f.id, f.passage_embeddings) for f in fragments])


def passage_columns(items: list[tuple[str, Any]]) -> tuple[list[str], list[int], list[Vector | None]]:
    """(fragment id, its passage vectors) pairs as the three columns of fragment_passages rows."""
    ids, ordinals, vectors = [], [], []
    for fragment_id, passage_vectors in items:
        for ordinal, vector in enumerate(passage_vectors if passage_vectors is not None else []):
            ids.append(fragment_id)
            ordinals.append(ordinal)
            vectors.append(_vector(vector))
    return ids, ordinals, vectors


async def _insert_passages(conn: asyncpg.Connection, items: list[tuple[str, Any]]) -> None:
    ids, ordinals, vectors = passage_columns(items)
    if ids:
        await conn.execute(
            "INSERT INTO fragment_passages (fragment_id, key_id, ordinal, embedding) "
            "SELECT u.id, f.key_id, u.ordinal, u.embedding FROM unnest($1::text[], $2::smallint[], $3::vector[]) "
            "AS u (id, ordinal, embedding) LEFT JOIN fragments f ON f.id = u.id",
            ids, ordinals, vectors,
        )


async def copy_passages(conn: asyncpg.Connection, source_id: str, target_id: str) -> None:
    await conn.execute(
        "INSERT INTO fragment_passages (fragment_id, key_id, ordinal, embedding) "
        "SELECT $2, (SELECT key_id FROM fragments WHERE id = $2), ordinal, embedding FROM fragment_passages WHERE fragment_id = $1",
        source_id, target_id,
    )


async def replace_passages(conn: asyncpg.Connection, items: list[tuple[str, Any]]) -> None:
    """The fragments' passage vectors after their content (and so their embedding) changed."""
    if items:
        await conn.execute("DELETE FROM fragment_passages WHERE fragment_id = ANY($1::text[])", [i for i, _ in items])
        await _insert_passages(conn, items)


def filter_clauses(principal: Principal, flt: FragmentFilter, params: SqlParams, alias: str = "f") -> list[str]:
    """The WHERE clauses every layer shares: tenant, workspace, validity and the recall filters."""
    scope = [scope_clause(principal.reads, params, alias), workspace_scope(flt.workspace, params, alias)]
    return scope + narrowing_clauses(flt, params, alias)


def narrowing_clauses(flt: FragmentFilter, params: SqlParams, alias: str = "f") -> list[str]:
    """filter_clauses without the tenant and workspace scope: validity and the recall filters,
    for a query that writes its scope as ranges (vector_search)."""
    a = alias
    clauses: list[str] = []
    if flt.as_of is not None:
        p = params.add(flt.as_of)
        clauses.append(f"{a}.valid_from <= {p} AND ({a}.valid_to IS NULL OR {a}.valid_to > {p})")
    elif not flt.include_superseded:
        clauses.append(f"{a}.valid_to IS NULL")
    if flt.topic is not None:
        clauses.append(f"{a}.topic = {params.add(flt.topic)}")
    if flt.types:
        clauses.append(f"{a}.type = ANY({params.add(list(flt.types))}::text[])")
    if flt.agent_id is not None:
        clauses.append(f"{a}.agent_id = {params.add(flt.agent_id)}")
    if flt.min_importance is not None:
        clauses.append(f"{a}.importance >= {params.add(flt.min_importance)}")
    if flt.is_anchor is not None:
        clauses.append(f"{a}.is_anchor = {params.add(flt.is_anchor)}")
    if flt.affects:
        clauses.append(f"{a}.affect = ANY({params.add(list(flt.affects))}::text[])")
    if flt.case_id is not None:
        clauses.append(f"{a}.case_id = {params.add(flt.case_id)}")
    if flt.resolution_status is not None:
        clauses.append(f"{a}.resolution_status = {params.add(flt.resolution_status)}")
    if flt.phase is not None:
        clauses.append(f"{a}.phase = {params.add(flt.phase)}")
    if flt.time_from is not None:
        clauses.append(f"{a}.created_at >= {params.add(flt.time_from)}")
    if flt.time_to is not None:
        clauses.append(f"{a}.created_at <= {params.add(flt.time_to)}")
    if flt.exclude_ids:
        clauses.append(f"NOT ({a}.id = ANY({params.add(list(flt.exclude_ids))}::text[]))")
    if flt.session_id is not None:
        clauses.append(f"{a}.session_id = {params.add(flt.session_id)}")
    # Session-scoped fragments are working memory: only their own session reads them.
    clauses.append(f"({a}.scope = 'permanent' OR {a}.session_id = {params.add(flt.caller_session)})")
    return clauses


async def vector_candidates(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, embedding: np.ndarray, limit: int
) -> list[tuple[str, float]]:
    """L3: cosine distance over the HNSW index with every filter inside the scan.

    hnsw.iterative_scan (vector_search.graph_settings, on the pool) keeps scanning until `limit` rows pass the
    filters, so a selective tenant or workspace filter never empties the top k.
    """
    params = SqlParams()
    vec = params.add(embedding)
    where = filter_clauses(principal, flt, params)
    sql = f"""
        WITH nearest AS MATERIALIZED (
            SELECT f.id, f.embedding <=> {vec}::vector::halfvec AS distance
            FROM fragments f
            WHERE f.embedding IS NOT NULL AND {' AND '.join(where)}
            ORDER BY f.embedding <=> {vec}::vector::halfvec
            LIMIT {params.add(limit)}
        )
        SELECT id, distance FROM nearest ORDER BY distance + 0
    """  # + 0: a re-sort of the relaxed order Postgres 17+ would skip (vector_search._graph)
    rows = await conn.fetch(sql, *params.values)
    return [(r["id"], 1.0 - float(r["distance"])) for r in rows]


async def fetch_by_ids(conn: asyncpg.Connection, principal: Principal, ids: list[str]) -> dict[str, asyncpg.Record]:
    if not ids:
        return {}
    params = SqlParams()
    sql = f"""
        SELECT {FRAGMENT_COLUMNS}
        FROM fragments f
        WHERE f.id = ANY({params.add(ids)}::text[]) AND {scope_clause(principal.reads, params)}
    """
    rows = await conn.fetch(sql, *params.values)
    return {r["id"]: r for r in rows}


async def find_by_hash(
    conn: asyncpg.Connection, principal: Principal, pairs: list[tuple[str, str | None]]
) -> dict[tuple[str, str | None], str]:
    """(content_hash, workspace) -> id of a live fragment the caller owns with that content."""
    if not pairs:
        return {}
    params = SqlParams()
    owner = scope_clause(principal.owns, params)
    hashes = params.add([h for h, _ in pairs])
    workspaces = params.add([w for _, w in pairs])
    sql = f"""
        SELECT DISTINCT ON (f.content_hash, f.workspace) f.content_hash, f.workspace, f.id
        FROM fragments f
        JOIN unnest({hashes}::text[], {workspaces}::text[]) AS q(h, w)
          ON f.content_hash = q.h AND f.workspace IS NOT DISTINCT FROM q.w
        WHERE f.valid_to IS NULL AND {owner}
        ORDER BY f.content_hash, f.workspace, f.created_at
    """
    return {(r["content_hash"], r["workspace"]): r["id"] for r in await conn.fetch(sql, *params.values)}


async def find_duplicate(
    conn: asyncpg.Connection, principal: Principal, content_hash: str, workspace: str | None, scope: str,
    *, lock: bool = True,
) -> asyncpg.Record | None:
    """The oldest live fragment the caller owns with this content in this workspace and of
    this scope, locked for the refresh that follows (`lock`; without it, a look that needs
    no transaction). The scope must match: a permanent remember must not collapse into a
    session fragment that ends with its session."""
    params = SqlParams()
    owner = scope_clause(principal.owns, params)
    sql = f"""
        SELECT f.id, f.keywords, f.ttl_tier, f.scope
        FROM fragments f
        WHERE f.content_hash = {params.add(content_hash)} AND f.workspace IS NOT DISTINCT FROM {params.add(workspace)}
          AND f.scope = {params.add(scope)} AND f.valid_to IS NULL AND {owner}
        ORDER BY f.created_at
        LIMIT 1
        {"FOR UPDATE" if lock else ""}
    """
    return await conn.fetchrow(sql, *params.values)


async def refresh_duplicate(conn: asyncpg.Connection, fragment_id: str, importance: float, is_anchor: bool) -> str:
    """A second remember of the same content counts as a use of the stored copy: one more
    access, and the higher of the two importances is kept; an anchoring remember anchors it
    (anchors live in the permanent tier). Returns the copy's TTL tier."""
    return await conn.fetchval(
        """
        UPDATE fragments SET access_count = access_count + 1, last_accessed_at = now(),
               importance = greatest(importance, $2::real), is_anchor = is_anchor OR $3::boolean,
               ttl_tier = CASE WHEN $3::boolean THEN 'permanent' ELSE ttl_tier END
        WHERE id = $1
        RETURNING ttl_tier
        """,
        fragment_id, importance, is_anchor,
    )


async def delete_by_id(conn: asyncpg.Connection, principal: Principal, fragment_id: str, *, force: bool) -> tuple[int, int]:
    """Returns (deleted, protected). Permanent-tier fragments need force (seed)."""
    params = SqlParams()
    where = f"f.id = {params.add(fragment_id)} AND {scope_clause(principal.writes, params)}"
    row = await conn.fetchrow(f"SELECT f.id, f.ttl_tier FROM fragments f WHERE {where} FOR UPDATE", *params.values)
    if row is None:
        return 0, 0
    if row["ttl_tier"] == "permanent" and not force:
        return 0, 1
    await conn.execute("DELETE FROM fragments WHERE id = $1", fragment_id)
    return 1, 0


async def delete_by_topic(conn: asyncpg.Connection, principal: Principal, topic: str, *, force: bool) -> tuple[int, int]:
    params = SqlParams()
    where = f"f.topic = {params.add(topic)} AND {scope_clause(principal.writes, params)}"
    protected = 0
    if not force:
        protected = await conn.fetchval(
            f"SELECT count(*) FROM fragments f WHERE {where} AND f.ttl_tier = 'permanent'", *params.values
        )
        where += " AND f.ttl_tier <> 'permanent'"
    status = await conn.execute(f"DELETE FROM fragments f WHERE {where}", *params.values)
    return int(status.split()[-1]), int(protected)


async def preview_delete(
    conn: asyncpg.Connection, principal: Principal, *, fragment_id: str | None, topic: str | None
) -> list[asyncpg.Record]:
    params = SqlParams()
    target = f"f.id = {params.add(fragment_id)}" if fragment_id else f"f.topic = {params.add(topic)}"
    sql = f"""
        SELECT f.id, f.topic, f.type, f.ttl_tier, left(f.content, 120) AS content,
               (SELECT count(*) FROM fragment_links l WHERE l.from_id = f.id OR l.to_id = f.id) AS link_count
        FROM fragments f WHERE {target} AND {scope_clause(principal.writes, params)}
        ORDER BY f.created_at LIMIT 500
    """
    return await conn.fetch(sql, *params.values)


async def count_owned(conn: asyncpg.Connection, key_id: str) -> int:
    params = SqlParams()
    scope = scope_clause(TenantScope.key(key_id), params)
    return int(await conn.fetchval(f"SELECT count(*) FROM fragments f WHERE {scope}", *params.values))


async def stats(conn: asyncpg.Connection, principal: Principal) -> dict[str, Any]:
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    row = await conn.fetchrow(
        f"""
        SELECT count(*) AS total,
               count(*) FILTER (WHERE f.valid_to IS NULL) AS active,
               count(*) FILTER (WHERE f.valid_to IS NOT NULL) AS superseded,
               count(*) FILTER (WHERE f.is_anchor) AS anchors,
               count(*) FILTER (WHERE f.embedding IS NULL) AS without_embedding,
               avg(f.importance) AS avg_importance,
               count(DISTINCT f.topic) AS topics
        FROM fragments f WHERE {scope}
        """,
        *params.values,
    )
    by_type = await conn.fetch(f"SELECT f.type, count(*) AS n FROM fragments f WHERE {scope} GROUP BY 1 ORDER BY 1", *params.values)
    by_tier = await conn.fetch(f"SELECT f.ttl_tier, count(*) AS n FROM fragments f WHERE {scope} GROUP BY 1 ORDER BY 1", *params.values)
    return {
        "totalFragments": row["total"],
        "activeFragments": row["active"],
        "supersededFragments": row["superseded"],
        "anchorFragments": row["anchors"],
        "pendingEmbeddings": row["without_embedding"],
        "avgImportance": round(float(row["avg_importance"]), 4) if row["avg_importance"] is not None else None,
        "topicCount": row["topics"],
        "byType": {r["type"]: r["n"] for r in by_type},
        "ttlDistribution": {r["ttl_tier"]: r["n"] for r in by_tier},
    }


async def filtered_recent(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, limit: int
) -> list[tuple[str, float]]:
    """Filter-only recall (topic / caseId without a query): most important, then newest."""
    params = SqlParams()
    where = filter_clauses(principal, flt, params)
    rows = await conn.fetch(
        f"""
        SELECT f.id, f.importance FROM fragments f WHERE {' AND '.join(where)}
        ORDER BY f.importance DESC, f.created_at DESC LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    return [(r["id"], float(r["importance"])) for r in rows]


# A write that adds this share of the rows the statistics know of (or any write to a table
# never analysed) refreshes them at once: until ANALYZE sees a young store's rows the
# planner works from near-empty estimates and every recall runs ~3x slower.
YOUNG_STORE_SHARE = 0.2
# Held (session advisory lock) by the one refresh that runs at a time.
YOUNG_STORE_LOCK = "engram:statistics:young-store"


async def _outgrows_statistics(conn: asyncpg.Connection, inserted: int) -> bool:
    known = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'fragments'::regclass")
    return known is None or known < 0 or inserted >= YOUNG_STORE_SHARE * known


async def refresh_statistics_if_young(conn: asyncpg.Connection, inserted: int) -> bool:
    """ANALYZE the recall tables when `inserted` rows outgrow what their statistics know.

    One refresh at a time over the whole store: concurrent batches on a young store each see
    the statistics from before their neighbours' refresh, and each used to run its own (three
    ANALYZEs, ~70 ms of Postgres CPU at a few thousand turns). A write that finds a refresh
    running leaves the store to it (that ANALYZE, or the next write that outgrows it, sees its
    rows); one that takes the lock tests the share again against what a refresh that just
    finished has learnt."""
    if not await _outgrows_statistics(conn, inserted) or not await locks.try_lock(conn, YOUNG_STORE_LOCK):
        return False
    try:
        if not await _outgrows_statistics(conn, inserted):
            return False
        await conn.execute("ANALYZE fragments")
        await conn.execute("ANALYZE fragment_terms")
        await conn.execute("ANALYZE fragment_passages")
        return True
    finally:
        await locks.unlock(conn, YOUNG_STORE_LOCK)
