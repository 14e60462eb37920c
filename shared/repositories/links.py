"""Links between fragments."""

from __future__ import annotations

import asyncpg
import numpy as np

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
    """The links of $1's fragments to their nearest of a scope too large to compare exactly
    ($2 neighbours at cosine similarity $3 or more, owned by $4; `owner` from _owner_clause):
    through HNSW, the scope inside the scan."""
    return f"""
            INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
            SELECT s.id, x.id, 'related', (1 - x.distance)::real, $4
            FROM fragments s CROSS JOIN LATERAL (
                SELECT f.id, f.embedding <=> s.embedding AS distance FROM fragments f
                WHERE f.id <> s.id AND {owner} AND f.valid_to IS NULL AND f.embedding IS NOT NULL
                ORDER BY f.embedding <=> s.embedding LIMIT $2
            ) x
            WHERE s.id = ANY($1::text[]) AND (1 - x.distance)::real >= $3
            ON CONFLICT DO NOTHING
            """


def _vectors(rows: list[asyncpg.Record]) -> np.ndarray:
    """vector_send's binary form (dimensions, unused, then big-endian float4s) as float32
    rows: read without the pgvector codec, so any connection can run the link job."""
    return np.stack([np.frombuffer(r["v"], dtype=">f4", offset=4) for r in rows]).astype(np.float32)


def nearest_links(
    source_ids: list[str], sources: np.ndarray, scope_ids: list[str], scope: np.ndarray, neighbours: int, min_similarity: float
) -> list[tuple[str, str, float]]:
    """(from, to, similarity): each source's `neighbours` most cosine-similar rows of the
    scope (never itself) at `min_similarity` or more, as the exact SQL plan chose them."""
    if not len(scope_ids):
        return []
    unit = scope / np.maximum(np.linalg.norm(scope, axis=1, keepdims=True), 1e-30)
    similarity = (sources / np.maximum(np.linalg.norm(sources, axis=1, keepdims=True), 1e-30)) @ unit.T
    # Clamped as pgvector clamps its cosine: a twin's float32 product can pass 1.
    np.clip(similarity, -1.0, 1.0, out=similarity)
    position = {fragment_id: i for i, fragment_id in enumerate(scope_ids)}
    out = []
    for row, source_id in enumerate(source_ids):
        sims = similarity[row]
        own = position.get(source_id)
        if own is not None:
            sims[own] = -np.inf
        k = min(neighbours, len(scope_ids))
        best = np.argpartition(-sims, k - 1)[:k]
        for i in best[np.argsort(-sims[best], kind="stable")]:
            weight = float(np.float32(sims[i]))
            if weight >= min_similarity:
                out.append((source_id, scope_ids[i], weight))
    return out


async def auto_link(conn: asyncpg.Connection, fragment_ids: list[str]) -> int:
    """Link each not-yet-linked fragment to similar ones of its own tenant and workspace;
    idempotent. Call inside a transaction: the pending rows taken here are deleted with it
    (a concurrent call for the same fragments waits on them, then finds nothing to do), and
    come back if the links fail. A fragment without an embedding yet stays pending.

    A scope of at most EXACT_SCOPE live fragments is read once and compared in numpy: one
    matrix product for the job's fragments of that scope. Postgres computing each cosine in
    a per-source scan cost 0.17 ms of backend CPU a LoCoMo turn (~600-turn workspaces), the
    link job's whole cost, and most of it executor work around each 384-float product."""
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
        owner_params: list[object] = []
        owner = _owner_clause("f", scope["key_id"], scope["workspace"], owner_params)
        near = await conn.fetch(
            f"""SELECT f.id, vector_send(f.embedding) AS v FROM fragments f
                WHERE {owner} AND f.valid_to IS NULL AND f.embedding IS NOT NULL LIMIT {EXACT_SCOPE + 1}""",
            *owner_params,
        )
        if len(near) > EXACT_SCOPE:
            params: list[object] = [scope["ids"], AUTO_LINK_NEIGHBOURS, AUTO_LINK_MIN_SIMILARITY, scope["key_id"]]
            status = await conn.execute(link_statement(_owner_clause("f", scope["key_id"], scope["workspace"], params)), *params)
            linked += int(status.split()[-1])
            continue
        sources = await conn.fetch(
            "SELECT id, vector_send(embedding) AS v FROM fragments WHERE id = ANY($1::text[]) ORDER BY id", scope["ids"]
        )
        links = nearest_links(
            [r["id"] for r in sources], _vectors(sources), [r["id"] for r in near], _vectors(near) if near else np.zeros((0, 0)),
            AUTO_LINK_NEIGHBOURS, AUTO_LINK_MIN_SIMILARITY,
        )
        if links:
            status = await conn.execute(
                """
                INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
                SELECT l.from_id, l.to_id, 'related', l.weight, $4
                FROM unnest($1::text[], $2::text[], $3::real[]) AS l(from_id, to_id, weight)
                ON CONFLICT DO NOTHING
                """,
                [f for f, _, _ in links], [t for _, t, _ in links], [w for _, _, w in links], scope["key_id"],
            )
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
