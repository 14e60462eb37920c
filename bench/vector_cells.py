"""A filtered scope's nearest fragments from a few of its cells instead of all its rows: the
feasibility measure for an inverted-file (IVF) layout inside the covering btree.

    python -m bench.vector_cells --database-url DSN --namespace NS [--cells 1024] [--probes 64,128,256]

Each fragment gets a cell: the nearest of `--cells` centroids (spherical k-means over a sample
of the store's own embeddings: vector_cells.train, as the maintenance worker trains them). A
scope's rows are copied into a scratch table keyed by (cell, importance) and carrying the half
vector, as `fragments_scope_vectors` does by (key, workspace, type, importance); a second index
on the same table, by importance alone, is the exact ranking's.
Each question is then ranked exactly (every row of the scope, as nearest() does within its cap)
and from its `p` nearest cells only, for each `p` of `--probes`, in turn on one connection. The
numbers: ms p50 / p95 client-side, and the overlap with the exact ranking's top 60 (the vector
layer's depth) and top 10. Nothing of the store is changed; the scratch table is dropped at the end.
Its indexes carry less than the covering index (no valid_to, scope, session_id), so both rankings
read narrower tuples than nearest() does: the ratio between them is the measure, not the ms.
The centroids' sample (rows ordered by md5(id), so a rerun draws the same) reads the whole table
once and each scope's vectors are read in full: the store is colder afterwards, so run this
apart from timed passes.

NS is the namespace of an earlier `bench.recall_load` / `bench.growth_bench` load; the scopes are
its master-key (workspace, type) pairs, the `--scopes` largest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
import numpy as np

from bench.corpus import generate, text_queries
from bench.harness import percentile
from services.recall.search import LAYER_DEPTH
from shared.db import create_pool
from shared.embeddings import load_embedder
from shared.repositories import vector_cells

SCRATCH = "bench_vector_cells_{pid}"


def cells_of(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each row's cell: its nearest centroid by cosine."""
    return np.argmax(vectors @ centroids.T, axis=1).astype(np.int16)


def probed_cells(query: np.ndarray, centroids: np.ndarray, probes: int) -> list[int]:
    """The query's `probes` nearest cells, nearest first."""
    return [int(c) for c in np.argsort(-(centroids @ query))[:probes]]


@dataclass
class ScopeResult:
    rows: int
    exact_ms: list[float] = field(default_factory=list)
    probe_ms: dict[int, list[float]] = field(default_factory=dict)
    overlap: dict[int, list[float]] = field(default_factory=dict)  # share of the exact top k found
    overlap10: dict[int, list[float]] = field(default_factory=dict)  # share of the exact top 10 found
    visited: dict[int, list[float]] = field(default_factory=dict)  # share of the scope's rows in the probed cells
    returned: dict[int, list[int]] = field(default_factory=dict)  # rows the ranking from the probed cells returned


async def measure_scope(
    conn: asyncpg.Connection, table: str, ids: Sequence[str], importance: Sequence[float], vectors: np.ndarray,
    centroids: np.ndarray, queries: Sequence[np.ndarray], probes: Sequence[int], floor: float, k: int = LAYER_DEPTH,
) -> ScopeResult:
    """The scope's rows in a scratch table `table` (made here, dropped after), each query ranked
    exactly and from each count of probed cells in turn."""
    cells = cells_of(vectors, centroids)
    await conn.execute(f"DROP TABLE IF EXISTS {table}")
    await conn.execute(f"CREATE UNLOGGED TABLE {table} (id text, cell int2, importance real, embedding_half halfvec({vectors.shape[1]}))")
    try:
        await conn.copy_records_to_table(
            table, records=[(i, int(c), float(w), v.tolist()) for i, c, w, v in zip(ids, cells, importance, vectors, strict=True)],
            columns=["id", "cell", "importance", "embedding_half"],
        )
        await conn.execute(f"CREATE INDEX {table}_exact ON {table} (importance) INCLUDE (id, embedding_half)")
        await conn.execute(f"CREATE INDEX {table}_cells ON {table} (cell, importance) INCLUDE (id, embedding_half)")
        await conn.execute(f"VACUUM ANALYZE {table}")  # the visibility map, so both rankings read their index alone
        exact_sql = f"SELECT id FROM {table} WHERE importance >= $2 ORDER BY embedding_half <=> $1::halfvec LIMIT {k}"
        cell_sql = (f"SELECT id FROM {table} WHERE cell = ANY($3::int2[]) AND importance >= $2 "
                    f"ORDER BY embedding_half <=> $1::halfvec LIMIT {k}")
        in_floor = np.asarray(importance) >= floor
        per_cell = np.bincount(cells[in_floor], minlength=len(centroids))
        result = ScopeResult(rows=int(in_floor.sum()))
        async with conn.transaction():
            # Both statements read their index alone, without workers, as nearest()'s exact ranking does.
            await conn.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; "
                               "SET LOCAL max_parallel_workers_per_gather = 0")
            for query in queries[:5]:  # warm the scratch table's pages
                await conn.fetch(exact_sql, query.tolist(), floor)
            for query in queries:
                began = time.perf_counter()
                exact = [r["id"] for r in await conn.fetch(exact_sql, query.tolist(), floor)]
                result.exact_ms.append((time.perf_counter() - began) * 1000)
                for p in probes:
                    probed = probed_cells(query, centroids, p)
                    began = time.perf_counter()
                    found = {r["id"] for r in await conn.fetch(cell_sql, query.tolist(), floor, probed)}
                    result.probe_ms.setdefault(p, []).append((time.perf_counter() - began) * 1000)
                    result.overlap.setdefault(p, []).append(len(found.intersection(exact)) / max(1, len(exact)))
                    result.overlap10.setdefault(p, []).append(len(found.intersection(exact[:10])) / max(1, len(exact[:10])))
                    result.visited.setdefault(p, []).append(float(per_cell[probed].sum()) / max(1, result.rows))
                    result.returned.setdefault(p, []).append(len(found))
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
    return result


async def run(
    database_url: str, namespace: str, n_cells: int, probes: list[int], n_queries: int, seed: int, scopes: int,
    floor: float, sample: int,
) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1)
    table = SCRATCH.format(pid=os.getpid())
    try:
        async with pool.acquire() as conn:
            drawn = await conn.fetch(
                "SELECT embedding FROM fragments WHERE embedding IS NOT NULL AND workspace LIKE $1 || '-%' "
                "ORDER BY md5(id) LIMIT $2", namespace, sample)
            train = np.stack([np.asarray(r["embedding"].to_numpy(), dtype=np.float32) for r in drawn])
            began = time.perf_counter()
            centroids = vector_cells.train(train / np.linalg.norm(train, axis=1, keepdims=True), n_cells, seed=seed)
            print(f"{n_cells} cells from {len(train)} sampled embeddings ({time.perf_counter() - began:.1f} s)")
            embedder = load_embedder(latency=True)
            questions = [q.arguments["text"] for q in text_queries(generate(5_000, seed=seed), n_queries, seed=seed + 1)]
            queries = [np.asarray(embedder.embed([q])[0], dtype=np.float32) for q in questions]
            largest = await conn.fetch(
                "SELECT workspace, type, count(*) AS n FROM fragments WHERE key_id IS NULL AND workspace LIKE $1 || '-%' "
                "AND embedding IS NOT NULL AND valid_to IS NULL GROUP BY 1, 2 ORDER BY 3 DESC LIMIT $2", namespace, scopes)
            print(f"{n_queries} questions, importance >= {floor}, k = {LAYER_DEPTH}; ms p50 / p95, overlap with the exact "
                  f"top {LAYER_DEPTH} / top 10, share of the scope's rows in the probed cells")
            for scope in largest:
                rows = await conn.fetch(
                    "SELECT id, importance, embedding FROM fragments WHERE key_id IS NULL AND workspace = $1 AND type = $2 "
                    "AND embedding IS NOT NULL AND valid_to IS NULL", scope["workspace"], scope["type"])
                vectors = np.stack([np.asarray(r["embedding"].to_numpy(), dtype=np.float32) for r in rows])
                result = await measure_scope(
                    conn, table, [r["id"] for r in rows], [float(r["importance"]) for r in rows], vectors, centroids,
                    queries, probes, floor)
                name = f"{scope['workspace'].removeprefix(namespace + '-')}/{scope['type']}"
                print(f"  {name:24s} {result.rows:7d} rows  exact {percentile(result.exact_ms, 50):6.2f} / "
                      f"{percentile(result.exact_ms, 95):6.2f}")
                for p in probes:
                    print(f"  {'':24s} {p:4d} cells  {percentile(result.probe_ms[p], 50):6.2f} / {percentile(result.probe_ms[p], 95):6.2f}"
                          f"  {statistics.mean(result.overlap[p]):.3f} / {statistics.mean(result.overlap10[p]):.3f}"
                          f"  {statistics.mean(result.visited[p]):.3f}")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--cells", type=int, default=1024)
    parser.add_argument("--probes", default="64,128,256", help="comma-separated counts of nearest cells to rank")
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--scopes", type=int, default=4, help="the largest master-key (workspace, type) scopes to measure")
    parser.add_argument("--floor", type=float, default=0.3, help="the importance floor of every question")
    parser.add_argument("--sample", type=int, default=100_000, help="embeddings the centroids are trained on")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.namespace, args.cells, [int(p) for p in args.probes.split(",")], args.queries,
                    args.seed, args.scopes, args.floor, args.sample))


if __name__ == "__main__":
    main()
