"""Migrations 0034 and 0035 on a store written before them: the float embeddings become the
one half-precision column, the indexes that read the old columns are rebuilt or left to the
worker, and the cells versions already built get their training size."""

from __future__ import annotations

import asyncpg
import numpy as np

from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.repositories import vector_cells, vector_search
from tests.support import Stack, migrated_before

FIRST = "0034_one_half_vector.sql"
DIM = 384


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


async def _store_before_0034(conn: asyncpg.Connection, vectors: dict[str, np.ndarray]) -> None:
    """Fragments with float embeddings, a type graph on the float vectors (0028) and a cells
    version (0033) with its index on the generated half column."""
    for fid, vector in vectors.items():
        await conn.execute(
            "INSERT INTO fragments (id, content, topic, type, key_id, workspace, content_hash, embedding)"
            " VALUES ($1, $1, 't', 'fact', NULL, 'ws', $1, $2)", fid, vector)
    await conn.execute(
        "CREATE INDEX fragments_embedding_hnsw_fact ON fragments USING hnsw (embedding vector_cosine_ops) WHERE type = 'fact'")
    await conn.execute("INSERT INTO vector_cells (version, cell, centroid) VALUES (1, 0, $1::real[]::halfvec)",
                       [float(x) for x in next(iter(vectors.values()))])
    await conn.execute("CREATE INDEX fragments_cells_v1 ON fragments (key_id, workspace, type, importance) INCLUDE (embedding_half)")
    await conn.execute("ANALYZE fragments")


async def test_0034_keeps_each_embedding_in_half_precision_and_rebuilds_what_read_the_old_columns(stack: Stack) -> None:
    async with migrated_before(stack.database_url, FIRST) as (conn, rest):
        rng = np.random.default_rng(34)
        vectors = {f"f-{i}": _unit(rng.normal(size=DIM)) for i in range(40)}
        await _store_before_0034(conn, vectors)
        for _, sql in rest:
            await conn.execute(sql)

        column = await conn.fetchval(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'fragments'::regclass"
            " AND attname = 'embedding' AND NOT attisdropped")
        assert column == "halfvec(384)"
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'fragments'::regclass AND attname = 'embedding_half'") == 0
        stored = {r["id"]: np.asarray(r["v"], dtype=np.float32)
                  for r in await conn.fetch("SELECT id, embedding::real[] AS v FROM fragments")}
        assert stored.keys() == vectors.keys()
        assert all(np.array_equal(stored[i], v.astype(np.float16).astype(np.float32)) for i, v in vectors.items())

        indexes = dict(await conn.fetch(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'fragments'::regclass"))
        assert "USING hnsw (embedding halfvec_cosine_ops)" in indexes["fragments_embedding_hnsw"]
        assert "INCLUDE (valid_to, scope, session_id, id, embedding)" in indexes["fragments_scope_vectors"]
        assert "fragments_embedding_hnsw_fact" not in indexes and "fragments_cells_v1" not in indexes
        assert dict(await conn.fetch("SELECT version, trained_rows FROM vector_cell_versions")) == {1: len(vectors)}

        # Both plans of nearest() read the new column: the exact one and the HNSW walk.
        query = vectors["f-7"]
        principal = Principal(key_id=None)
        exact = await vector_search.nearest(conn, principal, FragmentFilter(workspace="ws"), query, 3)
        walked = await vector_search.nearest(conn, principal, FragmentFilter(), query, 3)
        assert exact[0][0] == walked[0][0] == "f-7" and exact[0][1] > 0.999

        # The worker retires the centroids whose index went with the old column.
        assert await vector_cells.ensure_cells(conn, 10**9, cells=4, sample_size=100, concurrently=False) is None
        assert await conn.fetchval("SELECT count(*) FROM vector_cells") == 0
        assert await conn.fetchval("SELECT count(*) FROM vector_cell_versions") == 0
