"""The mnemory REST surface's reads and metadata writes over fragments (reference 004):
fragments joined with their mnemory_memories row (migration 0018), filtered the way the
reference filters (memory_type, categories, role, labels, layer, dates, decay)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np

from shared.domain.principal import Principal, SqlParams, TenantScope, scope_clause

MEMORY_COLUMNS = """
    f.id, f.content, f.type, f.topic, f.importance, f.is_anchor, f.agent_id, f.key_id,
    f.created_at, f.updated_at, f.content_hash,
    m.memory_type, m.categories, m.role, m.memory_layer, m.labels, m.event_date, m.expires_at, m.session_id,
    EXISTS (SELECT 1 FROM fragment_artifacts a WHERE a.fragment_id = f.id) AS has_artifacts
"""
_FROM = "fragments f LEFT JOIN mnemory_memories m ON m.fragment_id = f.id"
# The memory_type of a row with or without its mnemory row (shared.domain.mnemory.MEMORY_TYPE).
MEMORY_TYPE_SQL = (
    "coalesce(m.memory_type, CASE f.type WHEN 'preference' THEN 'preference' WHEN 'procedure' THEN 'procedural' "
    "WHEN 'episode' THEN 'episodic' ELSE 'fact' END)"
)
# Importance levels as the fragment's number (shared.domain.mnemory._IMPORTANCE_FLOORS).
IMPORTANCE_FLOOR = {"low": 0.0, "normal": 0.35, "high": 0.7, "critical": 0.9}


@dataclass(frozen=True)
class MemoryFilter:
    """The reference's filters; None is "any". agent_id: the caller's agent (X-Agent-Id):
    its own memories plus the shared ones (agent 'default'), mnemory's dual scope."""

    agent_id: str | None = None
    memory_types: tuple[str, ...] | None = None
    categories: tuple[str, ...] | None = None
    role: str | None = None
    labels: dict[str, Any] | None = None
    include_decayed: bool = False
    memory_layer: str | None = None
    exclude_layers: tuple[str, ...] = ()
    date_start: datetime | None = None
    date_end: datetime | None = None  # exclusive
    since: datetime | None = None
    pinned: bool | None = None
    min_importance: str | None = None


def category_clause(categories: Sequence[str], params: SqlParams) -> str:
    """A memory (row `m`) in any of `categories` or their subcategories (project -> project:x):
    the REST listing's filter, and fsck's selection (shared/repositories/fsck.py)."""
    cats = params.add(list(categories))
    return f"EXISTS (SELECT 1 FROM unnest(m.categories) c WHERE c = ANY({cats}::text[]) OR split_part(c, ':', 1) = ANY({cats}::text[]))"


def _where(scope: TenantScope, flt: MemoryFilter, params: SqlParams) -> str:
    clauses = [scope_clause(scope, params), "f.valid_to IS NULL", "f.scope = 'permanent'"]
    if flt.agent_id:
        clauses.append(f"f.agent_id = ANY({params.add([flt.agent_id, 'default'])}::text[])")
    if flt.memory_types:
        clauses.append(f"{MEMORY_TYPE_SQL} = ANY({params.add(list(flt.memory_types))}::text[])")
    if flt.categories:
        clauses.append(category_clause(flt.categories, params))
    if flt.role:
        clauses.append(f"coalesce(m.role, 'user') = {params.add(flt.role)}")
    if flt.labels:
        clauses.append(f"coalesce(m.labels, '{{}}'::jsonb) @> {params.add(json.dumps(flt.labels))}::jsonb")
    if not flt.include_decayed:
        clauses.append("(m.expires_at IS NULL OR m.expires_at > now())")
    if flt.memory_layer:
        clauses.append(f"coalesce(m.memory_layer, 'consolidated') = {params.add(flt.memory_layer)}")
    if flt.exclude_layers:
        clauses.append(f"coalesce(m.memory_layer, 'consolidated') <> ALL({params.add(list(flt.exclude_layers))}::text[])")
    if flt.date_start:
        clauses.append(f"coalesce(m.event_date, f.created_at) >= {params.add(flt.date_start)}")
    if flt.date_end:
        clauses.append(f"coalesce(m.event_date, f.created_at) < {params.add(flt.date_end)}")
    if flt.since:
        clauses.append(f"f.created_at >= {params.add(flt.since)}")
    if flt.pinned is not None:
        clauses.append(f"f.is_anchor = {params.add(flt.pinned)}")
    if flt.min_importance:
        clauses.append(f"f.importance >= {params.add(IMPORTANCE_FLOOR[flt.min_importance])}")
    return " AND ".join(clauses)


async def search(
    conn: asyncpg.Connection, principal: Principal, flt: MemoryFilter, embedding: np.ndarray, limit: int, min_score: float
) -> list[tuple[asyncpg.Record, float]]:
    """The `limit` memories closest to `embedding` with a cosine of at least `min_score`."""
    params = SqlParams()
    vec = params.add(embedding)
    where = _where(principal.reads, flt, params)
    rows = await conn.fetch(
        f"""
        SELECT {MEMORY_COLUMNS}, 1 - (f.embedding <=> {vec}::vector::halfvec) AS score FROM {_FROM}
        WHERE f.embedding IS NOT NULL AND {where}
        ORDER BY f.embedding <=> {vec}::vector::halfvec LIMIT {params.add(limit)}
        """,
        *params.values,
    )
    # The iterative scan's relaxed order is only roughly best first: sort what it found.
    scored = sorted(((r, float(r["score"])) for r in rows), key=lambda pair: -pair[1])
    return [(r, score) for r, score in scored if score >= min_score]


async def list_memories(
    conn: asyncpg.Connection, principal: Principal, flt: MemoryFilter, limit: int, *, newest_first: bool = True,
    by_importance: bool = False,
) -> list[asyncpg.Record]:
    params = SqlParams()
    where = _where(principal.reads, flt, params)
    order = "f.importance DESC, f.created_at DESC" if by_importance else f"f.created_at {'DESC' if newest_first else 'ASC'}"
    return await conn.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM {_FROM} WHERE {where} ORDER BY {order}, f.id LIMIT {params.add(limit)}",
        *params.values,
    )


async def by_ids(conn: asyncpg.Connection, principal: Principal, ids: list[str]) -> list[asyncpg.Record]:
    """The caller's live memories among `ids`, in the order asked; others are skipped."""
    params = SqlParams()
    where = _where(principal.reads, MemoryFilter(include_decayed=True), params)
    rows = await conn.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM {_FROM} WHERE f.id = ANY({params.add(ids)}::text[]) AND {where}", *params.values
    )
    found = {r["id"]: r for r in rows}
    return [found[i] for i in dict.fromkeys(ids) if i in found]


async def owned(conn: asyncpg.Connection, principal: Principal, memory_id: str) -> asyncpg.Record | None:
    """The memory if the caller may change it (its own; the master key: any)."""
    params = SqlParams()
    where = scope_clause(principal.writes, params)
    return await conn.fetchrow(
        f"SELECT {MEMORY_COLUMNS} FROM {_FROM} WHERE f.id = {params.add(memory_id)} AND f.valid_to IS NULL AND {where}",
        *params.values,
    )


async def category_counts(conn: asyncpg.Connection, principal: Principal) -> tuple[dict[str, int], int]:
    """Memories per category, and the caller's live memories in all."""
    params = SqlParams()
    where = _where(principal.reads, MemoryFilter(), params)
    rows = await conn.fetch(
        f"SELECT c AS category, count(*) AS n FROM {_FROM} CROSS JOIN LATERAL unnest(m.categories) c WHERE {where} GROUP BY c",
        *params.values,
    )
    params = SqlParams()
    where = _where(principal.reads, MemoryFilter(), params)
    total = await conn.fetchval(f"SELECT count(*) FROM {_FROM} WHERE {where}", *params.values)
    return {r["category"]: int(r["n"]) for r in rows}, int(total)


async def upsert_meta(
    conn: asyncpg.Connection, fragment_id: str, *, memory_type: str | None, categories: list[str], role: str,
    memory_layer: str, labels: dict[str, Any], event_date: datetime | None, expires_at: datetime | None,
    session_id: str | None, replace: bool,
) -> None:
    """The fragment's mnemory row; replace=False keeps a row that exists (a duplicate add)."""
    conflict = (
        """DO UPDATE SET memory_type = EXCLUDED.memory_type, categories = EXCLUDED.categories, role = EXCLUDED.role,
           memory_layer = EXCLUDED.memory_layer, labels = EXCLUDED.labels, event_date = EXCLUDED.event_date,
           expires_at = EXCLUDED.expires_at, session_id = coalesce(EXCLUDED.session_id, mnemory_memories.session_id)"""
        if replace else "DO NOTHING"
    )
    await conn.execute(
        f"""
        INSERT INTO mnemory_memories
            (fragment_id, key_id, memory_type, categories, role, memory_layer, labels, event_date, expires_at, session_id)
        VALUES ($1, (SELECT key_id FROM fragments WHERE id = $1), $2, $3, $4, $5, $6::jsonb, $7, $8, $9)
        ON CONFLICT (fragment_id) {conflict}
        """,
        fragment_id, memory_type, categories, role, memory_layer, json.dumps(labels), event_date, expires_at, session_id,
    )


async def set_agent(conn: asyncpg.Connection, principal: Principal, fragment_id: str, agent_id: str) -> None:
    params = SqlParams()
    where = scope_clause(principal.writes, params)
    await conn.execute(
        f"UPDATE fragments f SET agent_id = {params.add(agent_id)}, updated_at = now() WHERE f.id = {params.add(fragment_id)} AND {where}",
        *params.values,
    )


async def set_layer(conn: asyncpg.Connection, fragment_ids: list[str], layer: str) -> None:
    await conn.execute(
        "UPDATE mnemory_memories SET memory_layer = $2 WHERE fragment_id = ANY($1::text[])", fragment_ids, layer
    )


async def consolidated_twin(conn: asyncpg.Connection, principal: Principal, row: asyncpg.Record) -> str | None:
    """A live consolidated memory of the same tenant saying the same (same content hash)."""
    params = SqlParams()
    where = _where(principal.owns, MemoryFilter(include_decayed=True, memory_layer="consolidated"), params)
    value: str | None = await conn.fetchval(
        f"""SELECT f.id FROM {_FROM} WHERE {where} AND f.content_hash = {params.add(row["content_hash"])}
            AND f.id <> {params.add(row["id"])} ORDER BY f.created_at LIMIT 1""",
        *params.values,
    )
    return value
