"""Memory entries (reference 001): the fragments of a namespace, as the memory REST API reads
and writes them. An entry is a live, permanent fragment (superseded versions are history
and session-scoped ones working memory, neither an entry); its tags are the fragment's
keywords, its source the fragment's source column ('manual', anything else reads as
'auto'), its metadata the fragment's metadata column."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
from pgvector import Vector

from shared.domain.fragment import NewFragment
from shared.domain.principal import SqlParams, TenantScope, scope_clause
from shared.repositories.fragments import content_morphemes, passage_columns

ENTRY_COLUMNS = "f.id, f.namespace_id, f.content, f.source, f.keywords, f.metadata, f.created_at, f.updated_at"
ENTRY = "f.valid_to IS NULL AND f.scope = 'permanent'"
# Rows per round trip of the export cursor.
EXPORT_PREFETCH = 1000

# fragments.py's insert with the two columns this API adds (namespace_id, metadata) and the
# entry's own updated_at: a namespace named by id, never by the topic trigger's name lookup.
_INSERT = """
INSERT INTO fragments (
    id, content, topic, type, keywords, importance, source, scope, is_anchor, ttl_tier,
    key_id, workspace, workspace_source, agent_id, content_hash, embedding, search_tsv,
    namespace_id, metadata, created_at, updated_at
)
SELECT
    r.id, r.content, r.topic, r.type, k.keywords, r.importance, r.source, 'permanent', false, r.ttl_tier,
    r.key_id, r.workspace, r.workspace_source, 'default', r.content_hash, r.embedding,
    setweight(to_tsvector('english', r.content), 'B')
    || setweight(to_tsvector('simple', r.topic || ' ' || array_to_string(k.keywords, ' ')), 'A')
    || setweight(to_tsvector('simple', r.morphemes), 'B'),
    r.namespace_id, r.metadata::jsonb, coalesce(r.created_at, now()), coalesce(r.updated_at, r.created_at, now())
FROM unnest(
    $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::real[], $7::text[], $8::text[],
    $9::text[], $10::text[], $11::text[], $12::text[], $13::vector[], $14::text[], $15::uuid[], $16::text[],
    $17::timestamptz[], $18::timestamptz[]
) AS r(
    id, content, topic, type, keywords_json, importance, source, ttl_tier,
    key_id, workspace, workspace_source, content_hash, embedding, morphemes, namespace_id, metadata,
    created_at, updated_at
)
CROSS JOIN LATERAL (SELECT ARRAY(SELECT jsonb_array_elements_text(r.keywords_json::jsonb)) AS keywords) k
"""


def _vector(value: Any) -> Vector | None:
    return value if value is None or isinstance(value, Vector) else Vector(value)


def metadata_of(value: Any) -> dict[str, Any]:
    """The jsonb column as an object ({} when unset)."""
    if value is None:
        return {}
    parsed = json.loads(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, dict) else {}


async def insert_entries(
    conn: asyncpg.Connection, fragments: list[NewFragment], namespace_ids: list[uuid.UUID],
    metadata: list[dict[str, Any] | None], updated_at: list[datetime | None],
) -> None:
    """Fragments as entries of the given namespaces (parallel lists), with their passages."""
    if not fragments:
        return
    rows = [
        (f.id, f.content, f.topic, f.type, json.dumps(f.keywords, ensure_ascii=False), f.importance, f.source, f.ttl_tier,
         f.key_id, f.workspace, f.workspace_source, f.content_hash, _vector(f.embedding), content_morphemes(f.content), ns,
         json.dumps(meta, ensure_ascii=False) if meta is not None else None, f.extra.get("created_at"), updated)
        for f, ns, meta, updated in zip(fragments, namespace_ids, metadata, updated_at, strict=True)
    ]
    await conn.execute(_INSERT, *[list(column) for column in zip(*rows, strict=True)])
    ids, ordinals, vectors = passage_columns([(f.id, f.passage_embeddings) for f in fragments])
    if ids:
        await conn.execute(
            "INSERT INTO fragment_passages (fragment_id, key_id, ordinal, embedding) "
            "SELECT u.id, f.key_id, u.ordinal, u.embedding FROM unnest($1::text[], $2::smallint[], $3::vector[]) "
            "AS u (id, ordinal, embedding) LEFT JOIN fragments f ON f.id = u.id",
            ids, ordinals, vectors,
        )


def _in_namespace(scope: TenantScope, namespace_id: uuid.UUID, params: SqlParams) -> str:
    return f"f.namespace_id = {params.add(namespace_id)} AND {ENTRY} AND {scope_clause(scope, params)}"


async def entries_of(conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID) -> list[asyncpg.Record]:
    """Every entry of the namespace in storage order (oldest first)."""
    params = SqlParams()
    sql = f"SELECT {ENTRY_COLUMNS} FROM fragments f WHERE {_in_namespace(scope, namespace_id, params)} ORDER BY f.created_at, f.id"
    return await conn.fetch(sql, *params.values)


def _filters(scope: TenantScope, namespace_id: uuid.UUID, tag: str | None, q: str | None, params: SqlParams) -> str:
    where = [_in_namespace(scope, namespace_id, params)]
    if tag is not None:
        where.append(f"{params.add(tag)} = ANY(f.keywords)")
    if q is not None:
        where.append(f"strpos(lower(f.content), lower({params.add(q)})) > 0")
    return " AND ".join(where)


async def page(
    conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, *, tag: str | None, q: str | None,
    sort: str, descending: bool, limit: int, offset: int,
) -> tuple[list[asyncpg.Record], int]:
    """A filtered page and the total matching before limit / offset. tag: one of the entry's
    tags exactly; q: a case-insensitive substring of the content."""
    count_params = SqlParams()
    total = int(await conn.fetchval(
        f"SELECT count(*) FROM fragments f WHERE {_filters(scope, namespace_id, tag, q, count_params)}", *count_params.values
    ))
    params = SqlParams()
    where = _filters(scope, namespace_id, tag, q, params)
    column = "f.updated_at" if sort == "updated" else "f.created_at"
    direction = "DESC" if descending else "ASC"
    sql = f"""
        SELECT {ENTRY_COLUMNS} FROM fragments f WHERE {where}
        ORDER BY {column} {direction}, f.id {direction} LIMIT {params.add(limit)} OFFSET {params.add(offset)}
    """
    return await conn.fetch(sql, *params.values), total


async def get_entry(
    conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, entry_id: str, *, lock: bool = False
) -> asyncpg.Record | None:
    params = SqlParams()
    where = f"f.id = {params.add(entry_id)} AND {_in_namespace(scope, namespace_id, params)}"
    suffix = " FOR UPDATE" if lock else ""
    sql = f"SELECT {ENTRY_COLUMNS}, f.embedding::vector AS embedding FROM fragments f WHERE {where}{suffix}"
    return await conn.fetchrow(sql, *params.values)


async def by_ids(conn: asyncpg.Connection, scope: TenantScope, ids: list[str]) -> dict[str, asyncpg.Record]:
    """Entries among `ids` in `scope` (any namespace), by id."""
    if not ids:
        return {}
    params = SqlParams()
    where = f"f.id = ANY({params.add(ids)}::text[]) AND {ENTRY} AND {scope_clause(scope, params)}"
    rows = await conn.fetch(f"SELECT {ENTRY_COLUMNS} FROM fragments f WHERE {where}", *params.values)
    return {r["id"]: r for r in rows}


async def update_entry(conn: asyncpg.Connection, entry_id: str, changes: dict[str, Any]) -> None:
    """Set content (with content_hash, embedding), keywords (tags), source, metadata; then the
    full-text vector is rebuilt from the row (fragments.refresh_search_tsv's weights)."""
    params = SqlParams()
    sets = []
    for column in ("content", "content_hash", "keywords", "source"):
        if column in changes:
            sets.append(f"{column} = {params.add(changes[column])}")
    if "embedding" in changes:
        sets.append(f"embedding = {params.add(_vector(changes['embedding']))}::vector")
    if "metadata" in changes:
        sets.append(f"metadata = {params.add(json.dumps(changes['metadata'], ensure_ascii=False))}::jsonb")
    sets.append("updated_at = now()")
    text_changed = "content" in changes or "keywords" in changes
    if text_changed:
        sets.append(
            "search_tsv = setweight(to_tsvector('english', " + (params.add(changes["content"]) if "content" in changes else "content")
            + "), 'B') || setweight(to_tsvector('simple', topic || ' ' || array_to_string("
            + (params.add(changes["keywords"]) + "::text[]" if "keywords" in changes else "keywords")
            + ", ' ')), 'A') || setweight(to_tsvector('simple', " + params.add(changes.get("morphemes", "")) + "), 'B')"
        )
    await conn.execute(f"UPDATE fragments SET {', '.join(sets)} WHERE id = {params.add(entry_id)}", *params.values)


async def delete_entries(conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, ids: list[str]) -> list[str]:
    """Deletes the entries among `ids` that are in the namespace; returns their ids."""
    params = SqlParams()
    where = f"f.id = ANY({params.add(ids)}::text[]) AND {_in_namespace(scope, namespace_id, params)}"
    return [r["id"] for r in await conn.fetch(f"DELETE FROM fragments f WHERE {where} RETURNING f.id", *params.values)]


async def clear(conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID) -> int:
    """Every fragment of the namespace (entries and their history); the namespace stays."""
    params = SqlParams()
    where = f"f.namespace_id = {params.add(namespace_id)} AND {scope_clause(scope, params)}"
    status = await conn.execute(f"DELETE FROM fragments f WHERE {where}", *params.values)
    return int(status.split()[-1])


async def move(
    conn: asyncpg.Connection, scope: TenantScope, source: uuid.UUID, target: uuid.UUID, ids: list[str]
) -> list[str]:
    """Re-homes the entries among `ids` that are in `source`: id, content, source, tags,
    metadata and timestamps stay as they are (updated_at too). Returns the moved ids."""
    params = SqlParams()
    target_param = params.add(target)
    where = f"f.id = ANY({params.add(ids)}::text[]) AND {_in_namespace(scope, source, params)}"
    sql = f"UPDATE fragments f SET namespace_id = {target_param} WHERE {where} RETURNING f.id"
    return [r["id"] for r in await conn.fetch(sql, *params.values)]


async def in_namespaces(
    conn: asyncpg.Connection, scope: TenantScope, namespace_ids: list[uuid.UUID], *, recent_first: bool = False,
    limit: int | None = None,
) -> list[asyncpg.Record]:
    """The entries of these namespaces (the injection's flat set): in storage order, or most
    recently used first (the context's order), at most `limit`."""
    if not namespace_ids:
        return []
    params = SqlParams()
    where = f"f.namespace_id = ANY({params.add(namespace_ids)}::uuid[]) AND {ENTRY} AND {scope_clause(scope, params)}"
    order = "coalesce(f.last_accessed_at, f.updated_at) DESC, f.id" if recent_first else "f.created_at, f.id"
    bound = f" LIMIT {params.add(limit)}" if limit is not None else ""
    sql = f"SELECT {ENTRY_COLUMNS}, f.importance, f.last_accessed_at FROM fragments f WHERE {where} ORDER BY {order}{bound}"
    return await conn.fetch(sql, *params.values)


async def mark_referenced(conn: asyncpg.Connection, ids: list[str]) -> None:
    """The context included these entries: one access each, which the recall scorer's recency
    (last_accessed_at) and activation read."""
    if ids:
        await conn.execute(
            "UPDATE fragments SET access_count = access_count + 1, last_accessed_at = now() WHERE id = ANY($1::text[])", ids
        )


async def newest_auto(
    conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, limit: int, *, with_embedding: bool = False
) -> list[asyncpg.Record]:
    """The namespace's most recently updated auto entries (consolidation's working set)."""
    params = SqlParams()
    where = f"{_in_namespace(scope, namespace_id, params)} AND f.source IS DISTINCT FROM 'manual'"
    columns = ENTRY_COLUMNS + (", f.embedding::vector AS embedding" if with_embedding else "")
    sql = f"SELECT {columns} FROM fragments f WHERE {where} ORDER BY f.updated_at DESC, f.id DESC LIMIT {params.add(limit)}"
    return await conn.fetch(sql, *params.values)


async def stream_entries(conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID) -> AsyncIterator[asyncpg.Record]:
    """The namespace's entries in storage order through a cursor (inside a transaction)."""
    params = SqlParams()
    sql = f"SELECT {ENTRY_COLUMNS} FROM fragments f WHERE {_in_namespace(scope, namespace_id, params)} ORDER BY f.created_at, f.id"
    async for row in conn.cursor(sql, *params.values, prefetch=EXPORT_PREFETCH):
        yield row


async def counts_by_namespace(conn: asyncpg.Connection, scope: TenantScope) -> list[asyncpg.Record]:
    """Per namespace and fragment type: entries, manual ones, characters (the token estimate)."""
    params = SqlParams()
    sql = f"""
        SELECT f.namespace_id, f.type, count(*) AS entries, count(*) FILTER (WHERE f.source = 'manual') AS manual,
               coalesce(sum(length(f.content)), 0) AS chars
        FROM fragments f WHERE f.namespace_id IS NOT NULL AND {ENTRY} AND {scope_clause(scope, params)}
        GROUP BY f.namespace_id, f.type
    """
    return await conn.fetch(sql, *params.values)


async def created_per_day(conn: asyncpg.Connection, scope: TenantScope, excluded: list[uuid.UUID]) -> list[asyncpg.Record]:
    params = SqlParams()
    sql = f"""
        SELECT (f.created_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n
        FROM fragments f
        WHERE f.namespace_id IS NOT NULL AND NOT (f.namespace_id = ANY({params.add(excluded)}::uuid[]))
          AND {ENTRY} AND {scope_clause(scope, params)}
        GROUP BY 1 ORDER BY 1
    """
    return await conn.fetch(sql, *params.values)


async def recently_updated(
    conn: asyncpg.Connection, scope: TenantScope, excluded: list[uuid.UUID], limit: int
) -> list[asyncpg.Record]:
    params = SqlParams()
    sql = f"""
        SELECT {ENTRY_COLUMNS} FROM fragments f
        WHERE f.namespace_id IS NOT NULL AND NOT (f.namespace_id = ANY({params.add(excluded)}::uuid[]))
          AND {ENTRY} AND {scope_clause(scope, params)}
        ORDER BY f.updated_at DESC, f.id DESC LIMIT {params.add(limit)}
    """
    return await conn.fetch(sql, *params.values)
