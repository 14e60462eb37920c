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


# A (owner, workspace) scope of at most this many live fragments is compared exactly; a
# larger one through HNSW with the scope inside the scan. Walking the graph of a 100k store
# for the few hundred rows of a small workspace took ~20 s per batch of 200.
EXACT_SCOPE = 3000


def _owner_clause(alias: str, key_id: str | None, workspace: str | None, params: list[object]) -> str:
    """Same owner and workspace, written so the (key_id, workspace) index can find them."""
    clauses = []
    for column, value in (("key_id", key_id), ("workspace", workspace)):
        if value is None:
            clauses.append(f"{alias}.{column} IS NULL")
        else:
            params.append(value)
            clauses.append(f"{alias}.{column} = ${len(params)}")
    return " AND ".join(clauses)


def link_statement(owner: str) -> str:
    """The links of $1's fragments to their nearest of one scope ($2 neighbours at cosine
    similarity $3 or more, owned by $4; `owner` from _owner_clause). The distance is the one
    column the rows are sorted and kept by: with the similarity in the select list and the
    distance in ORDER BY (two expressions) every row of the exact plan cost two cosines, and
    those were most of the job (0.25 -> 0.17 ms of backend CPU a fragment, LoCoMo turns in
    ~600-turn workspaces; the same links)."""
    return f"""
            WITH src AS (SELECT id, embedding FROM fragments WHERE id = ANY($1::text[])),
            near AS MATERIALIZED (
                SELECT f.id, f.embedding FROM fragments f
                WHERE {owner} AND f.valid_to IS NULL AND f.embedding IS NOT NULL LIMIT {EXACT_SCOPE + 1}
            ),
            n AS (SELECT count(*) AS rows FROM near)
            INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
            SELECT s.id, x.id, 'related', (1 - x.distance)::real, $4
            FROM src s CROSS JOIN LATERAL (
                (SELECT d.id, d.distance FROM (
                    SELECT c.id, c.embedding <=> s.embedding AS distance FROM near c
                    WHERE (SELECT rows FROM n) <= {EXACT_SCOPE} AND c.id <> s.id
                 ) d ORDER BY d.distance LIMIT $2)
                UNION ALL
                (SELECT f.id, f.embedding <=> s.embedding AS distance FROM fragments f
                 WHERE (SELECT rows FROM n) > {EXACT_SCOPE} AND f.id <> s.id AND {owner}
                   AND f.valid_to IS NULL AND f.embedding IS NOT NULL
                 ORDER BY f.embedding <=> s.embedding LIMIT $2)
            ) x
            WHERE (1 - x.distance)::real >= $3
            ON CONFLICT DO NOTHING
            """


async def auto_link(conn: asyncpg.Connection, fragment_ids: list[str]) -> int:
    """Link each not-yet-linked fragment to similar ones of its own tenant and workspace;
    idempotent. Call inside a transaction: the pending rows taken here are deleted with it
    (a concurrent call for the same fragments waits on them, then finds nothing to do), and
    come back if the links fail. A fragment without an embedding yet stays pending."""
    scopes = await conn.fetch(
        """
        WITH taken AS (
            DELETE FROM fragment_link_pending p USING fragments f
            WHERE p.fragment_id = ANY($1::text[]) AND f.id = p.fragment_id AND f.embedding IS NOT NULL
            RETURNING f.id, f.key_id, f.workspace
        )
        SELECT key_id, workspace, array_agg(id) AS ids FROM taken GROUP BY key_id, workspace
        """,
        fragment_ids,
    )
    linked = 0
    for scope in scopes:
        params: list[object] = [scope["ids"], AUTO_LINK_NEIGHBOURS, AUTO_LINK_MIN_SIMILARITY, scope["key_id"]]
        owner = _owner_clause("f", scope["key_id"], scope["workspace"], params)
        status = await conn.execute(link_statement(owner), *params)
        linked += int(status.split()[-1])
    return linked


async def unlinked_fragment_ids(conn: asyncpg.Connection, limit: int) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT p.fragment_id FROM fragment_link_pending p JOIN fragments f ON f.id = p.fragment_id
        WHERE f.embedding IS NOT NULL ORDER BY p.created_at LIMIT $1
        """,
        limit,
    )
    return [r["fragment_id"] for r in rows]


# Directed relations: a chain of them must not loop back (A caused_by B caused_by A).
# related and contradicts are symmetric and carry no direction to cycle on.
DIRECTED_RELATIONS = ("caused_by", "resolved_by", "part_of", "superseded_by")
# Cycle search depth: deeper causal chains than this are not a realistic memory graph.
CYCLE_SEARCH_DEPTH = 64


async def get_link(conn: asyncpg.Connection, from_id: str, to_id: str, relation_type: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT from_id, to_id, relation_type, weight FROM fragment_links WHERE from_id = $1 AND to_id = $2 AND relation_type = $3",
        from_id, to_id, relation_type,
    )


async def upsert_link(
    conn: asyncpg.Connection, from_id: str, to_id: str, relation_type: str, weight: float, key_id: str | None
) -> bool:
    """Create the link or update its weight; True when it was created."""
    return bool(
        await conn.fetchval(
            """
            INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (from_id, to_id, relation_type) DO UPDATE SET weight = EXCLUDED.weight
            RETURNING (xmax = 0)
            """,
            from_id, to_id, relation_type, weight, key_id,
        )
    )


async def path_between(conn: asyncpg.Connection, start: str, goal: str, relation_type: str) -> list[str] | None:
    """The ids of a chain start -> ... -> goal along relation_type links, or None."""
    row = await conn.fetchrow(
        """
        WITH RECURSIVE walk(id, path, depth) AS (
            SELECT $1::text, ARRAY[$1::text], 0
            UNION ALL
            SELECT l.to_id, w.path || l.to_id, w.depth + 1
            FROM walk w JOIN fragment_links l ON l.from_id = w.id AND l.relation_type = $3
            WHERE NOT l.to_id = ANY(w.path) AND w.depth < $4
        )
        SELECT path FROM walk WHERE id = $2 ORDER BY depth LIMIT 1
        """,
        start, goal, relation_type, CYCLE_SEARCH_DEPTH,
    )
    return list(row["path"]) if row else None
