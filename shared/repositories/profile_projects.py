"""Owner projects of the remember profile (reference 003; migration 0021): a tenant's
projects/<name>/ paths exist once created."""

from __future__ import annotations

import asyncpg

from shared.domain.principal import SqlParams, TenantScope, scope_clause


async def exists(conn: asyncpg.Connection, owner: TenantScope, name: str) -> bool:
    params = SqlParams()
    where = f"p.name = {params.add(name)} AND {scope_clause(owner, params, 'p')}"
    return bool(await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM profile_projects p WHERE {where})", *params.values))


async def create(conn: asyncpg.Connection, key_id: str | None, name: str) -> bool:
    """Create the project for the tenant; False when it existed already."""
    status = await conn.execute(
        "INSERT INTO profile_projects (key_id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING", key_id, name
    )
    return status.endswith(" 1")
