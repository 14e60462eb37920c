"""The memory REST API's consolidation status per tenant (migration 0016): when the LLM pass
last ran, when a pass was last attempted, and the last error."""

from __future__ import annotations

import asyncpg


def tenant_of(key_id: str | None) -> str:
    """The status row's tenant: the key id, or '' for the master key's own store."""
    return key_id or ""


async def status(conn: asyncpg.Connection, key_id: str | None) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT last_run_at, last_attempt_at, last_error FROM memory_consolidation_status WHERE tenant = $1", tenant_of(key_id)
    )


async def record_attempt(conn: asyncpg.Connection, key_id: str | None, *, ran: bool, error: str | None) -> None:
    """A pass was attempted now; it ran its LLM step (ran) or not; error replaces the last one
    (None clears it)."""
    await conn.execute(
        """
        INSERT INTO memory_consolidation_status AS s (tenant, last_run_at, last_attempt_at, last_error)
        VALUES ($1, CASE WHEN $2 THEN now() END, now(), $3)
        ON CONFLICT (tenant) DO UPDATE SET
            last_attempt_at = now(),
            last_run_at = CASE WHEN $2 THEN now() ELSE s.last_run_at END,
            last_error = $3
        """,
        tenant_of(key_id), ran, error,
    )
