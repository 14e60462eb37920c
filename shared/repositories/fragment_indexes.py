"""The indexes on fragments that the maintenance worker builds itself (type graphs, vector
cells), found by their name's prefix."""

from __future__ import annotations

import asyncpg


async def by_prefix(conn: asyncpg.Connection, prefix: str) -> dict[str, bool]:
    """The indexes on fragments named `prefix` + something, by that something: valid, or left
    invalid by a concurrent build that did not finish."""
    pattern = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"
    rows = await conn.fetch(
        """
        SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'fragments'::regclass AND c.relname LIKE $1
        """,
        pattern,
    )
    return {r["relname"].removeprefix(prefix): bool(r["indisvalid"]) for r in rows}
