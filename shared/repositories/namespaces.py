"""Memory namespaces (reference 001's "memory banks"): the rows that hold a bank's name,
description, enabled flag and timestamps. Its entries are fragments (fragments.namespace_id;
shared/repositories/memory_entries.py); migration 0015 says how every fragment gets one."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause

NAMESPACE_COLUMNS = "n.id, n.key_id, n.name, n.description, n.enabled, n.created_at, n.updated_at"


async def namespace_of_fragments(conn: asyncpg.Connection, ids: list[str]) -> dict[str, str]:
    """Fragment id -> its namespace's id (a UUID string), for the fragments among `ids` that
    exist. Not tenant-scoped: the caller already holds the fragments (an event's payload)."""
    if not ids:
        return {}
    rows = await conn.fetch(
        "SELECT id, namespace_id FROM fragments WHERE id = ANY($1::text[]) AND namespace_id IS NOT NULL", ids
    )
    return {r["id"]: str(r["namespace_id"]) for r in rows}


async def list_namespaces(conn: asyncpg.Connection, scope: TenantScope) -> list[asyncpg.Record]:
    """The namespaces of `scope`, oldest first."""
    params = SqlParams()
    sql = f"SELECT {NAMESPACE_COLUMNS} FROM memory_namespaces n WHERE {scope_clause(scope, params, 'n')} ORDER BY n.created_at, n.id"
    return await conn.fetch(sql, *params.values)


async def get_namespace(
    conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, *, lock: bool = False
) -> asyncpg.Record | None:
    params = SqlParams()
    where = f"n.id = {params.add(namespace_id)} AND {scope_clause(scope, params, 'n')}"
    suffix = " FOR UPDATE" if lock else ""
    return await conn.fetchrow(f"SELECT {NAMESPACE_COLUMNS} FROM memory_namespaces n WHERE {where}{suffix}", *params.values)


async def find_by_name(conn: asyncpg.Connection, scope: TenantScope, name: str) -> asyncpg.Record | None:
    """The oldest namespace of `scope` with this name (import's matching, the trigger's rule)."""
    params = SqlParams()
    where = f"n.name = {params.add(name)} AND {scope_clause(scope, params, 'n')}"
    sql = f"SELECT {NAMESPACE_COLUMNS} FROM memory_namespaces n WHERE {where} ORDER BY n.created_at, n.id LIMIT 1"
    return await conn.fetchrow(sql, *params.values)


async def create_namespace(
    conn: asyncpg.Connection, key_id: str | None, name: str, description: str, *,
    enabled: bool = True, created_at: datetime | None = None, updated_at: datetime | None = None,
) -> asyncpg.Record:
    row = await conn.fetchrow(
        """
        INSERT INTO memory_namespaces AS n (id, key_id, name, description, enabled, created_at, updated_at)
        VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), coalesce($7, $6, now()))
        RETURNING n.id, n.key_id, n.name, n.description, n.enabled, n.created_at, n.updated_at
        """,
        uuid.uuid4(), key_id, name, description, enabled, created_at, updated_at,
    )
    assert row is not None  # noqa: S101 - INSERT ... RETURNING always returns its row
    return row


async def update_namespace(
    conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID, changes: dict[str, Any]
) -> asyncpg.Record | None:
    """Set the given columns (name, description, enabled) and updated_at; None when the
    namespace is not in `scope`. Columns not in `changes` are left as they are."""
    params = SqlParams()
    sets = [f"{column} = {params.add(value)}" for column, value in changes.items() if column in ("name", "description", "enabled")]
    sets.append("updated_at = now()")
    where = f"n.id = {params.add(namespace_id)} AND {scope_clause(scope, params, 'n')}"
    sql = f"UPDATE memory_namespaces n SET {', '.join(sets)} WHERE {where} RETURNING {NAMESPACE_COLUMNS}"
    return await conn.fetchrow(sql, *params.values)


async def touch(conn: asyncpg.Connection, namespace_ids: list[uuid.UUID]) -> None:
    """Its entries changed: the namespace's updated_at moves."""
    if namespace_ids:
        await conn.execute("UPDATE memory_namespaces SET updated_at = now() WHERE id = ANY($1::uuid[])", namespace_ids)


async def delete_namespace(conn: asyncpg.Connection, scope: TenantScope, namespace_id: uuid.UUID) -> bool:
    """The namespace and, by ON DELETE CASCADE, every fragment in it."""
    params = SqlParams()
    where = f"n.id = {params.add(namespace_id)} AND {scope_clause(scope, params, 'n')}"
    status = await conn.execute(f"DELETE FROM memory_namespaces n WHERE {where}", *params.values)
    return status.split()[-1] != "0"


async def enabled_ids(conn: asyncpg.Connection, scope: TenantScope) -> list[uuid.UUID]:
    params = SqlParams()
    sql = f"SELECT n.id FROM memory_namespaces n WHERE n.enabled AND {scope_clause(scope, params, 'n')} ORDER BY n.created_at, n.id"
    return [r["id"] for r in await conn.fetch(sql, *params.values)]
