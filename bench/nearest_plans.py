"""nearest()'s plans on one store, each forced in turn for every query of the filtered suite:
the exact ranking (fragments_scope_vectors' half vectors), the HNSW walk, and with the store's
cells index (vector_cells) what nearest() then does, by scope size: where the caps belong.

    python -m bench.nearest_plans --database-url DSN --namespace NS [--queries 300] [--seed 101] [--plans exact,graph,cells]

NS is the namespace of an earlier `bench.recall_load` / `bench.growth_bench` load. A plan is
forced through nearest()'s `scope_rows` (the count the statement decides by); the scope's true
size is counted apart. The plans run one after the other per query, their order rotating, on
one connection. Overlap is with the exact ranking's ids: the share of its top k (and top 10) a
plan returns. `cells` is nearest() with the valid cells version and the scope's count as recall
takes it (the true size, up to one past CELLS_COUNT_BOUND): exact up to CELLS_EXACT_ROWS, past
it the nearest cells.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import asyncpg

from bench.corpus import filtered_queries, generate
from bench.harness import percentile
from bench.recall_bench import scope_query
from services.recall.search import LAYER_DEPTH
from shared.db import create_pool
from shared.domain.principal import Principal, SqlParams
from shared.domain.search import FragmentFilter
from shared.embeddings import load_embedder
from shared.repositories import vector_cells, vector_search
from shared.repositories.fragments import filter_clauses
from shared.repositories.type_graphs import FRAGMENT_TYPES
from shared.settings import RecallSettings

# The k the vector layer asks nearest() for in a recall.
K = LAYER_DEPTH
BUCKETS = (5_000, 10_000, 15_000, 20_000, 25_000, 31_000, 45_000, 60_000, 90_000)


def _bucket(rows: int) -> str:
    low = 0
    for high in BUCKETS:
        if rows < high:
            return f"{low // 1000}-{high // 1000}k"
        low = high
    return f">= {BUCKETS[-1] // 1000}k"


async def _true_rows(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter) -> int:
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params))
    return int(await conn.fetchval(f"SELECT count(*) FROM fragments f WHERE f.embedding IS NOT NULL AND {where}", *params.values))


async def _caps(conn: asyncpg.Connection) -> str:
    """The exact cap of a scope of each type (its own graph's rows when it has a valid one),
    and of any other scope (the table's)."""
    caps = [f"table {await conn.fetchval(f'SELECT {vector_search._exact_cap(K)}')}"]
    for kind in FRAGMENT_TYPES:
        params = SqlParams()
        rows = vector_search._walked_rows(FragmentFilter(types=(kind,)), params)
        sql = f"SELECT {vector_search._exact_cap(K, rows)}"
        caps.append(f"{kind} {await conn.fetchval(sql, *params.values)}")
    return ", ".join(caps)


async def run(database_url: str, namespace: str, count: int, seed: int, plans: list[str]) -> None:
    settings = RecallSettings()
    pool = await create_pool(database_url, min_size=1, max_size=1, server_settings=vector_search.graph_settings(settings.hnsw_ef_search))
    embedder = load_embedder(latency=True)
    memories = generate(100_000, seed=seed)
    queries = filtered_queries(memories, count, seed=seed + 3)
    principal = Principal.master()
    forced = {"exact": 0, "graph": 10**9}
    async with pool.acquire() as conn:
        version = await vector_cells.current(conn)
    if "cells" in plans and version is None:
        raise SystemExit("the store has no valid cells index (maintenance.vector_cells builds it past VECTOR_CELLS_MIN_ROWS)")
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    overlap: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    async with pool.acquire() as conn:
        for i, query in enumerate(queries):
            args = scope_query(query, namespace)
            flt = FragmentFilter(workspace=args["workspace"], types=(args["type"],), min_importance=args["minImportance"])
            vector = embedder.embed([args["text"]])[0]
            true_rows = await _true_rows(conn, principal, flt)
            bucket = _bucket(true_rows)
            got: dict[str, list[str]] = {}
            order = plans[i % len(plans):] + plans[: i % len(plans)]
            for plan in order:
                began = time.perf_counter()
                if plan == "cells":
                    counted = min(true_rows, vector_search.CELLS_COUNT_BOUND + 1)
                    hits = await vector_search.nearest(conn, principal, flt, vector, K, counted, cells=version)
                else:
                    hits = await vector_search.nearest(conn, principal, flt, vector, K, forced[plan])
                times[bucket][plan].append((time.perf_counter() - began) * 1000)
                got[plan] = [fid for fid, _ in hits]
            truth = got.get("exact")
            if truth:
                for plan in plans:
                    overlap[bucket][plan].append(
                        (len(set(got[plan]) & set(truth)) / len(truth), len(set(got[plan][:10]) & set(truth[:10])) / len(truth[:10]))
                    )
        caps = await _caps(conn)
    await pool.close()
    print(f"nearest() by scope size, k = {K}, {count} filtered queries (seed {seed}), exact caps at this k"
          f" (rows, by the graph a walk takes): {caps}; ms p50 / p95, overlap with the exact ranking @{K} / @10")
    order_keys = sorted(times, key=lambda b: (b.startswith(">"), int(b.split("-")[0]) if not b.startswith(">") else 0))
    header = f"{'scope rows':>12s} {'n':>4s} " + " ".join(f"{p:>26s}" for p in plans)
    print(header)
    for bucket in order_keys:
        cells = []
        for plan in plans:
            samples = times[bucket][plan]
            ov = overlap[bucket][plan]
            at_k = sum(o[0] for o in ov) / len(ov) if ov else float("nan")
            at_10 = sum(o[1] for o in ov) / len(ov) if ov else float("nan")
            cells.append(f"{percentile(samples, 50):6.1f} / {percentile(samples, 95):6.1f} {at_k:5.3f}/{at_10:5.3f}")
        print(f"{bucket:>12s} {len(times[bucket][plans[0]]):4d} " + " ".join(f"{c:>26s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=101)
    parser.add_argument("--plans", default="exact,graph", help="comma-separated, of exact, graph, cells")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.namespace, args.queries, args.seed, args.plans.split(",")))


if __name__ == "__main__":
    main()
