"""Admin export and import of fragments (seed: /v1/internal/model/nothing/export, /import).

Export reads every fragment of the chosen tenant (all of them for the whole store) through a
server-side cursor, so a large store streams in bounded memory. The columns are what an
import needs to restore a fragment as it was: the embedding is left out (the import
recomputes it with the same model) and so are links and access statistics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause

# The export record, one JSON object per line, in this order.
EXPORT_COLUMNS = (
    "id", "content", "topic", "type", "keywords", "importance", "source", "scope", "is_anchor",
    "ttl_tier", "key_id", "workspace", "workspace_source", "agent_id", "session_id", "case_id",
    "goal", "outcome", "phase", "resolution_status", "assertion_status", "affect", "context_summary",
    "valid_from", "valid_to", "superseded_by", "created_at", "updated_at",
)
# Rows fetched per round trip of the export cursor.
EXPORT_PREFETCH = 500


def _wire(row: asyncpg.Record) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in EXPORT_COLUMNS:
        value = row[name]
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        out[name] = value
    return out


async def stream_fragments(
    conn: asyncpg.Connection, *, all_tenants: bool, key_id: str | None, topic: str | None
) -> AsyncIterator[dict[str, Any]]:
    """Fragments oldest first. all_tenants=False keeps one tenant: key_id's, or the master
    key's own (key_id NULL). Must run inside a transaction (cursor)."""
    params = SqlParams()
    clauses = [scope_clause(TenantScope(everyone=True) if all_tenants else TenantScope.key(key_id), params, None)]
    if topic is not None:
        clauses.append(f"topic = {params.add(topic)}")
    sql = f"SELECT {', '.join(EXPORT_COLUMNS)} FROM fragments WHERE {' AND '.join(clauses)} ORDER BY created_at, id"
    async for row in conn.cursor(sql, *params.values, prefetch=EXPORT_PREFETCH):
        yield _wire(row)


async def existing_owners(conn: asyncpg.Connection, ids: list[str]) -> dict[str, str | None]:
    """id -> key_id of the fragments that already exist among ids, whoever owns them: an
    import never writes over another tenant's fragment."""
    if not ids:
        return {}
    rows = await conn.fetch("SELECT id, key_id FROM fragments WHERE id = ANY($1::text[])", ids)
    return {r["id"]: r["key_id"] for r in rows}


async def known_key_ids(conn: asyncpg.Connection, key_ids: list[str]) -> set[str]:
    if not key_ids:
        return set()
    rows = await conn.fetch("SELECT id FROM api_keys WHERE id = ANY($1::text[])", key_ids)
    return {r["id"] for r in rows}
