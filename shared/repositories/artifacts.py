"""Artifact rows (reference 004): what is stored where for which memory. The bytes are in
shared/artifacts/ storage; the purge queue holds stored objects whose row is gone (filled by
the trigger of migration 0020)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause


@dataclass(frozen=True)
class ArtifactRow:
    id: str
    fragment_id: str
    key_id: str | None
    filename: str
    content_type: str
    size: int
    sha256: str
    backend: str
    storage_key: str
    created_at: datetime

    def metadata(self) -> dict[str, Any]:
        """The reference's artifact metadata: id, filename, content_type, size, created_at."""
        return {
            "id": self.id, "filename": self.filename, "content_type": self.content_type,
            "size": self.size, "created_at": self.created_at.isoformat(),
        }


_COLUMNS = "a.id, a.fragment_id, a.key_id, a.filename, a.content_type, a.size, a.sha256, a.backend, a.storage_key, a.created_at"


def _row(record: asyncpg.Record) -> ArtifactRow:
    return ArtifactRow(**dict(record))


async def fragment_tenant(conn: asyncpg.Connection, scope: TenantScope, fragment_id: str, *, lock: bool = False) -> tuple[bool, str | None]:
    """Whether the memory exists within `scope`, and its tenant (key_id). With lock, the row is
    held (FOR SHARE) until the transaction ends, so it cannot be deleted under a new artifact."""
    params = SqlParams()
    where = f"f.id = {params.add(fragment_id)} AND {scope_clause(scope, params)}"
    suffix = " FOR SHARE" if lock else ""
    row = await conn.fetchrow(f"SELECT f.key_id FROM fragments f WHERE {where}{suffix}", *params.values)
    return (row is not None, row["key_id"] if row is not None else None)


async def insert(
    conn: asyncpg.Connection, *, artifact_id: str, fragment_id: str, key_id: str | None, filename: str,
    content_type: str, size: int, sha256: str, backend: str, storage_key: str,
) -> ArtifactRow:
    record = await conn.fetchrow(
        """
        INSERT INTO fragment_artifacts AS a (id, fragment_id, key_id, filename, content_type, size, sha256, backend, storage_key)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        RETURNING a.id, a.fragment_id, a.key_id, a.filename, a.content_type, a.size, a.sha256, a.backend, a.storage_key,
                  a.created_at
        """,
        artifact_id, fragment_id, key_id, filename, content_type, size, sha256, backend, storage_key,
    )
    return _row(record)


async def list_for(conn: asyncpg.Connection, scope: TenantScope, fragment_id: str) -> list[ArtifactRow]:
    """The memory's artifacts, oldest first, when the memory is within `scope`."""
    params = SqlParams()
    where = f"a.fragment_id = {params.add(fragment_id)} AND {scope_clause(scope, params, 'f')}"
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM fragment_artifacts a JOIN fragments f ON f.id = a.fragment_id "
        f"WHERE {where} ORDER BY a.created_at, a.id",
        *params.values,
    )
    return [_row(r) for r in rows]


async def get(conn: asyncpg.Connection, scope: TenantScope, fragment_id: str, artifact_id: str) -> ArtifactRow | None:
    params = SqlParams()
    where = (
        f"a.id = {params.add(artifact_id)} AND a.fragment_id = {params.add(fragment_id)} "
        f"AND {scope_clause(scope, params, 'f')}"
    )
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM fragment_artifacts a JOIN fragments f ON f.id = a.fragment_id WHERE {where}",
        *params.values,
    )
    return _row(row) if row is not None else None


async def delete(conn: asyncpg.Connection, scope: TenantScope, fragment_id: str, artifact_id: str) -> bool:
    """Delete one artifact row (its object is queued for the purge by the trigger)."""
    params = SqlParams()
    where = (
        f"a.id = {params.add(artifact_id)} AND a.fragment_id = {params.add(fragment_id)} "
        f"AND EXISTS (SELECT 1 FROM fragments f WHERE f.id = a.fragment_id AND {scope_clause(scope, params, 'f')})"
    )
    status = await conn.execute(f"DELETE FROM fragment_artifacts a WHERE {where}", *params.values)
    return int(status.split()[-1]) > 0


async def take_purge_batch(conn: asyncpg.Connection, limit: int) -> list[tuple[str, str]]:
    """Queued (backend, storage_key) pairs, locked for this transaction (other purgers skip them)."""
    rows = await conn.fetch(
        "SELECT backend, storage_key FROM artifact_purge_queue ORDER BY queued_at LIMIT $1 FOR UPDATE SKIP LOCKED", limit
    )
    return [(r["backend"], r["storage_key"]) for r in rows]


async def purged(conn: asyncpg.Connection, items: list[tuple[str, str]]) -> None:
    if not items:
        return
    await conn.execute(
        "DELETE FROM artifact_purge_queue q USING unnest($1::text[], $2::text[]) AS d(backend, storage_key) "
        "WHERE q.backend = d.backend AND q.storage_key = d.storage_key",
        [b for b, _ in items], [k for _, k in items],
    )


async def queued_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM artifact_purge_queue"))
