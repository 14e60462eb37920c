"""Links between fragments."""

from __future__ import annotations

import asyncpg

# Auto-links: a new fragment is tied to its nearest live neighbours of the same owner and
# workspace (never across tenants) when cosine similarity reaches this.
AUTO_LINK_MIN_SIMILARITY = 0.75
AUTO_LINK_NEIGHBOURS = 3


async def insert_link(
    conn: asyncpg.Connection, from_id: str, to_id: str, relation_type: str, weight: float, key_id: str | None
) -> bool:
    status = await conn.execute(
        """
        INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
        VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING
        """,
        from_id, to_id, relation_type, weight, key_id,
    )
    return status.endswith("1")


async def auto_link(conn: asyncpg.Connection, fragment_ids: list[str]) -> int:
    """Link each not-yet-linked fragment to similar ones of its own tenant; idempotent."""
    status = await conn.execute(
        """
        WITH src AS (
            SELECT id, key_id, workspace, embedding FROM fragments
            WHERE id = ANY($1::text[]) AND auto_linked_at IS NULL AND embedding IS NOT NULL
        )
        INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
        SELECT s.id, n.id, 'related', n.sim, s.key_id
        FROM src s CROSS JOIN LATERAL (
            SELECT f.id, (1 - (f.embedding <=> s.embedding))::real AS sim
            FROM fragments f
            WHERE f.id <> s.id AND f.key_id IS NOT DISTINCT FROM s.key_id
              AND f.workspace IS NOT DISTINCT FROM s.workspace
              AND f.valid_to IS NULL AND f.embedding IS NOT NULL
            ORDER BY f.embedding <=> s.embedding
            LIMIT $2
        ) n
        WHERE n.sim >= $3
        ON CONFLICT DO NOTHING
        """,
        fragment_ids, AUTO_LINK_NEIGHBOURS, AUTO_LINK_MIN_SIMILARITY,
    )
    await conn.execute(
        "UPDATE fragments SET auto_linked_at = now() WHERE id = ANY($1::text[]) AND auto_linked_at IS NULL", fragment_ids
    )
    return int(status.split()[-1])


async def unlinked_fragment_ids(conn: asyncpg.Connection, limit: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT id FROM fragments WHERE auto_linked_at IS NULL AND embedding IS NOT NULL ORDER BY created_at LIMIT $1", limit
    )
    return [r["id"] for r in rows]
