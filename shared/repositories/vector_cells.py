"""K-means cells inside the covering btree: a large filtered scope ranked from its query's
nearest cells instead of all its rows (an inverted file, as pgvector's ivfflat, but keyed
below the tenant, workspace and type so the filters stay index ranges).

The exact ranking reads every row of a scope (vector_search), ~0.45-0.7 us a row warm: a
30-60k-row scope is 20-45 ms of one core at 1M, and the HNSW walk beyond the exact cap is as
costly and approximate. Each fragment's cell is the nearest of CELLS unit centroids (spherical
k-means over a sample of the store's own embeddings, trained by faiss). The index
fragments_cells_v<N> is fragments_scope_vectors with the cell between the type and the
importance, so a query reads the ranges of its p nearest cells: at 1M, cells enough for ~8,000
rows kept 0.98-1.0 of the exact top 60 and 0.996-1.0 of its top 10 past 15k rows, at 13-19 ms
p50 against the exact ranking's 18-83 (bench/README.md, session 40).

The cell is an index expression, not a column: a column would be filled by updating every row,
and an update of an indexed column is not HOT (every index again, the HNSW graphs included).
An index expression must be IMMUTABLE, so the centroids of a version are written once and never
changed (a trigger of migration 0033 refuses updates): version N is its centroids, its function
fragment_cell_v<N> and its index, built concurrently by the maintenance worker once the store
holds VECTOR_CELLS_MIN_ROWS embedded fragments. The function is a nearest-centroid search per
call (~0.2 ms with 1,024 centroids: once per write, never per row read, because its COST is
set so high that no plan evaluates it as a filter; at 629 cells in the array a plan that did
took 2.3 s a statement in session 40's trial). The centroids mix tenants' vectors as the HNSW
graphs do; no caller reads them.
"""

from __future__ import annotations

import logging

import asyncpg
import numpy as np

from shared.repositories import fragment_indexes, locks

logger = logging.getLogger(__name__)

CELLS = 1024
# Embeddings the centroids are trained on (faiss samples down to 256 a centroid anyway).
SAMPLE = 100_000
ITERATIONS = 20
INDEX_PREFIX = "fragments_cells_v"
FUNCTION_PREFIX = "fragment_cell_v"
# A nearest-centroid search is ~80,000 cpu_operator_costs of work, but its COST only has to make
# any plan that evaluates it per row dearer than reading the rows' cells from the index, even
# where the planner expects a row or two: at 100,000 the suite's store had a global range
# (workspace IS NULL, estimated at a row) read through another index with the function as a
# filter (session 41).
FUNCTION_COST = 1_000_000_000
# The index build reads the whole table and runs the function once a row (~3.5 min of one core
# at 1M on top of the btree build).
BUILD_TIMEOUT_S = 7200.0
_LOCK = "engram:vector-cells"


def index_name(version: int) -> str:
    return f"{INDEX_PREFIX}{int(version)}"


def function_name(version: int) -> str:
    return f"{FUNCTION_PREFIX}{int(version)}"


def cell_of(version: int, vector_sql: str) -> str:
    """SQL for a half vector's cell under `version`, as the index computes it."""
    return f"{function_name(version)}({vector_sql})"


def train(vectors: np.ndarray, cells: int = CELLS, seed: int = 0) -> np.ndarray:
    """`cells` unit centroids of the unit rows of `vectors`: spherical k-means (faiss), float32."""
    import faiss  # the worker's job only; recall and ingest never train

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    kmeans = faiss.Kmeans(x.shape[1], cells, niter=ITERATIONS, spherical=True, seed=seed, verbose=False)
    kmeans.train(x)
    centroids = np.asarray(kmeans.centroids, dtype=np.float32)
    return centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)


async def existing(conn: asyncpg.Connection) -> dict[int, bool]:
    """The cells indexes there are, by version: valid, or left invalid by a concurrent build
    that did not finish."""
    found = await fragment_indexes.by_prefix(conn, INDEX_PREFIX)
    return {int(version): valid for version, valid in found.items() if version.isdigit()}


async def current(conn: asyncpg.Connection) -> int | None:
    """The newest version whose index is built and valid: the one nearest() may probe."""
    valid = [version for version, ok in (await existing(conn)).items() if ok]
    return max(valid) if valid else None


async def embedded_rows(conn: asyncpg.Connection) -> int:
    """The planner's row count of fragments (every row but a few in backfill has its embedding)."""
    return int(await conn.fetchval("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'fragments'::regclass"))


async def sample(conn: asyncpg.Connection, size: int = SAMPLE) -> np.ndarray:
    """About `size` embeddings from across the table (block sampling, as ANALYZE reads it)."""
    rows = await embedded_rows(conn)
    share = 100.0 if rows <= size else min(100.0, 100.0 * 1.2 * size / rows)
    records = await conn.fetch(
        f"SELECT embedding::real[] AS v FROM fragments TABLESAMPLE SYSTEM ({share:.6f}) WHERE embedding IS NOT NULL LIMIT $1", size
    )
    return np.asarray([r["v"] for r in records], dtype=np.float32).reshape(len(records), -1)


async def trained_rows(conn: asyncpg.Connection, version: int) -> int | None:
    """The table's rows when `version` was trained (migration 0035)."""
    return await conn.fetchval("SELECT trained_rows FROM vector_cell_versions WHERE version = $1", version)


async def build(conn: asyncpg.Connection, centroids: np.ndarray, *, rows: int = 0, concurrently: bool = True) -> int:
    """A new version: its centroids written once (with `rows`, the table's rows they were
    trained at), its function, its index (concurrently: writes go on; `conn` must not be in a
    transaction then). Returns the version."""
    async with conn.transaction():
        version = int(await conn.fetchval("SELECT nextval('vector_cells_version')"))
        await conn.execute("INSERT INTO vector_cell_versions (version, trained_rows) VALUES ($1, $2)", version, rows)
        await conn.executemany(
            "INSERT INTO vector_cells (version, cell, centroid) VALUES ($1, $2, $3::real[]::halfvec)",
            [(version, cell, [float(v) for v in c]) for cell, c in enumerate(centroids)],
        )
        # IMMUTABLE: the rows of a version never change (vector_cells_write_once). Its own
        # search_path: an index build runs the function with a restricted one.
        await conn.execute(
            f"""
            CREATE FUNCTION {function_name(version)}(v halfvec) RETURNS integer
            LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE COST {FUNCTION_COST}
            SET search_path = {await conn.fetchval("SELECT current_schema()")}, public
            AS $$ SELECT cell FROM vector_cells WHERE version = {version} ORDER BY centroid <#> v LIMIT 1 $$
            """
        )
    await conn.execute(
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}{index_name(version)} ON fragments"
        f" (key_id, workspace, type, {cell_of(version, 'embedding')}, importance)"
        " INCLUDE (valid_to, scope, session_id, id, embedding) WHERE embedding IS NOT NULL",
        timeout=BUILD_TIMEOUT_S,
    )
    return version


async def retire(conn: asyncpg.Connection, version: int, *, concurrently: bool = True) -> None:
    """Drop a version: its index first (no write computes its cells after), then its function
    and centroids."""
    await conn.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {index_name(version)}")
    async with conn.transaction():
        await conn.execute(f"DROP FUNCTION IF EXISTS {function_name(version)}(halfvec)")
        await conn.execute("DELETE FROM vector_cells WHERE version = $1", version)
        await conn.execute("DELETE FROM vector_cell_versions WHERE version = $1", version)


async def ensure_cells(
    conn: asyncpg.Connection, min_rows: int, *, retrain_growth: float = 0.0, cells: int = CELLS, sample_size: int = SAMPLE,
    concurrently: bool = True,
) -> int | None:
    """The worker's run: train and build the cells once the table has `min_rows` rows, and
    again, beside the current version, once it has `retrain_growth` times the rows that
    version was trained at (0: never). A valid version older than the newest was superseded at
    least a run ago (recall learns the newest within ScopeSizes' minute) and is retired; an
    unfinished one (an invalid index, an interrupted concurrent build, or centroids without an
    index) is retired before anything is built. One run at a time across workers. Returns the
    version built, or None."""
    if not await locks.try_lock(conn, _LOCK):
        return None
    try:
        versions = await existing(conn)
        valid = sorted(version for version, ok in versions.items() if ok)
        written = {int(r["version"]) for r in await conn.fetch("SELECT DISTINCT version FROM vector_cells")}
        for version in sorted((set(versions) | written) - set(valid[-1:])):
            await retire(conn, version, concurrently=concurrently)
        rows = await embedded_rows(conn)
        if valid:
            trained = await trained_rows(conn, valid[-1])
            if retrain_growth <= 0 or trained is None or rows < retrain_growth * max(trained, min_rows):
                return None
            logger.info("vector cells v%d were trained at %d rows; the table has %d: training again", valid[-1], trained, rows)
        elif rows < min_rows:
            return None
        vectors = await sample(conn, sample_size)
        if len(vectors) < cells:
            return None
        logger.info("training %d vector cells on %d embeddings", cells, len(vectors))
        version = await build(conn, train(vectors, cells), rows=rows, concurrently=concurrently)
        logger.info("vector cells v%d built", version)
        return version
    finally:
        await locks.unlock(conn, _LOCK)
