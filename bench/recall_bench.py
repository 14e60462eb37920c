"""Read-path benchmark through MCP: load N fragments, then time recall end to end.

    python -m bench.recall_bench [--url URL --key KEY] [--n 10000] [--queries 300] [--clients 4]

Latency is measured client-side around `call_tool`, so it includes the gateway, auth, the
hop to recall, the query embedding, SQL and JSON on the way back. Every measured query is
distinct, so the L1 cache is not what is being timed.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.corpus import Query, filtered_queries, generate, keyword_queries, text_queries
from bench.harness import (
    LATENCY_HEADER, Target, add_target_arguments, latency_row, mcp_session, print_table, target_from, timed_call,
)
from bench.loading import BATCH, load, run_namespace

WARMUP = 30
# tokenBudget large enough that pageSize, not the budget, decides how many come back, so
# hit@10 means "the paraphrased fragment is among the first ten".
PAGE = {"pageSize": 10, "tokenBudget": 4000}


def scope_query(query: Query, namespace: str) -> dict:
    arguments = {**query.arguments, **PAGE}
    if "workspace" in arguments:
        arguments["workspace"] = f"{namespace}-{arguments['workspace']}"
    return arguments


async def time_queries(target: Target, queries: list[Query], namespace: str, ids: list[str | None]) -> tuple[list[float], float]:
    samples: list[float] = []
    hits = 0
    async with mcp_session(target) as session:
        for query in queries:
            ms, body = await timed_call(session, "recall", scope_query(query, namespace))
            samples.append(ms)
            hits += ids[query.expected] in {f.get("id") for f in body.get("fragments", [])}
    return samples, hits / len(queries) if queries else float("nan")


async def run(target: Target, n: int, count: int, clients: int, settle: float, seed: int) -> None:
    started = time.perf_counter()
    memories = generate(n, seed=seed)
    print(f"generated {n} fragments in {time.perf_counter() - started:.1f} s", flush=True)
    namespace = run_namespace(f"recall{n}")
    loaded = await load(target, memories, namespace, clients)
    load_row = latency_row("", loaded.batch_ms)
    print_table(
        f"load: batch_remember x{BATCH}, {clients} concurrent clients, embeddings on",
        ["fragments", "seconds", "fragments/s", "batch p50 ms", "batch p95 ms", "failed", "duplicates"],
        [[str(n), f"{loaded.seconds:.1f}", f"{loaded.rate:.0f}", load_row[2], load_row[3], str(loaded.failed), str(loaded.duplicates)]],
    )
    if settle:
        # Each batch enqueues link jobs for the worker; let them drain so they do not
        # compete with recall for the CPU (there is no public queue-depth tool to poll).
        print(f"settling {settle:.0f} s for background jobs", flush=True)
        await asyncio.sleep(settle)

    suites = {
        "text": text_queries(memories, WARMUP + count, seed=seed + 1),
        "keyword": keyword_queries(memories, WARMUP + count, seed=seed + 2),
        "filtered (ws+type+minImportance)": filtered_queries(memories, WARMUP + count, seed=seed + 3),
    }
    rows = []
    for name, queries in suites.items():
        await time_queries(target, queries[:WARMUP], namespace, loaded.ids)
        began = time.perf_counter()
        samples, hit_rate = await time_queries(target, queries[WARMUP:], namespace, loaded.ids)
        qps = len(samples) / (time.perf_counter() - began)
        rows.append(latency_row(name, samples, f"hit@10 {hit_rate:.2f}, {qps:.0f} q/s"))
    print_table(
        f"recall over MCP at {n} fragments (one client, sequential, pageSize 10, after {WARMUP} warm-up each)",
        LATENCY_HEADER, rows,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--n", type=int, default=10_000, help="fragments to load (100000 works; load takes a while)")
    parser.add_argument("--queries", type=int, default=300, help="measured queries per kind")
    parser.add_argument("--clients", type=int, default=4, help="concurrent batch_remember clients while loading")
    parser.add_argument("--settle", type=float, default=20, help="seconds to wait after loading")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with target_from(args) as target:
        asyncio.run(run(target, args.n, args.queries, args.clients, args.settle, args.seed))


if __name__ == "__main__":
    main()
