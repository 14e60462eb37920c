"""Recall's lexical layer alone (`retrieval.bm25_candidates`) on a bench.recall_load store:
the bench's query suites with the master key, the layer timed in process, its candidates saved.

    python bench/lexical_layer.py --database-url DSN --namespace NS [--kind text|keyword|filtered] [--out ids.json]
    python bench/lexical_layer.py --compare before.json after.json
    python bench/lexical_layer.py --recall --database-url DSN --namespace NS [--kind ...] [--n 100000]

Run as a file with PYTHONPATH set to a tree (a worktree of an older commit for "before") so
both sides time their own code; alternate the runs (A, B, A, B) on a shared machine. Query
terms and document frequencies come from that tree as well and are counted before the timed
call (recall caches them per scope), so only candidate generation is timed. `--compare`
prints how many of each query's candidates the two runs share, in the top 10 and in all.
`--recall` times the recall service's whole `recall()` instead (in process, no side effects
written) and prints hit@10 as bench.recall_load counts it (`--n`: the size that load was run
with).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.corpus import filtered_queries, generate, keyword_queries, text_queries
from bench.harness import percentile
from bench.locomo_rescore import NoEffects
from bench.recall_bench import scope_query
from bench.recall_load import loaded_ids
from services.common.internal import ToolContext
from services.recall.search import LAYER_DEPTH
from services.recall.service import ReadResources, recall
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, model_dir
from shared.repositories import retrieval, vector_search
from shared.settings import RecallSettings

SUITES: dict[str, Any] = {"text": text_queries, "keyword": keyword_queries, "filtered": filtered_queries}
WARMUP = 20


def _filter(arguments: dict[str, Any], namespace: str) -> FragmentFilter:
    if "workspace" not in arguments:
        return FragmentFilter()
    return FragmentFilter(workspace=f"{namespace}-{arguments['workspace']}", types=(arguments["type"],),
                          min_importance=arguments["minImportance"])


async def run(database_url: str, namespace: str, kind: str, count: int, seed: int) -> list[dict[str, Any]]:
    pool = await create_pool(database_url, min_size=1, max_size=1)
    principal = Principal.master()
    suite_seed = {"text": seed + 1, "keyword": seed + 2, "filtered": seed + 3}[kind]
    queries = SUITES[kind](generate(100_000, seed=seed), WARMUP + count, seed=suite_seed)
    times: list[float] = []
    saved: list[dict[str, Any]] = []
    try:
        async with pool.acquire() as conn:
            total = (await retrieval.count_in_scope(conn, principal, FragmentFilter())).rows
            for i, query in enumerate(queries):
                flt = _filter(query.arguments, namespace)
                text = query.arguments.get("text") or " ".join(query.arguments.get("keywords", []))
                keywords = query.arguments.get("keywords", [])
                terms = await retrieval.query_terms(conn, text, [k.lower() for k in keywords])
                corpus = FragmentFilter(workspace=flt.workspace)
                dfs = await retrieval.document_frequencies(conn, principal, corpus, terms)
                stats = retrieval.term_stats(dfs, total)
                began = time.perf_counter()
                ranked, avgdl = await retrieval.bm25_candidates(conn, principal, flt, stats, dfs, LAYER_DEPTH)
                elapsed = (time.perf_counter() - began) * 1000
                if i >= WARMUP:
                    times.append(elapsed)
                    saved.append({"query": text, "ids": [fid for fid, _ in ranked], "scores": [sc for _, sc in ranked], "avgdl": avgdl,
                                  "ms": elapsed, "rarest_df": min((d for d in dfs.values() if d > 0), default=0)})
    finally:
        await pool.close()
    line = (f"bm25_candidates, {kind}, n={len(times)}: p50 {percentile(times, 50):.2f}  p95 {percentile(times, 95):.2f}  "
            f"p99 {percentile(times, 99):.2f}  max {max(times):.2f} ms")
    print(line)  # noqa: T201
    long_lists = [x["ms"] for x in saved if x["rarest_df"] > retrieval.MATCH_BUDGET]
    if long_lists:
        line = (f"  queries whose every term has more than MATCH_BUDGET postings: n={len(long_lists)}, "
                f"p50 {percentile(long_lists, 50):.2f}  p95 {percentile(long_lists, 95):.2f} ms")
        print(line)  # noqa: T201
    return saved


async def run_recall(database_url: str, namespace: str, kind: str, count: int, seed: int, n: int) -> None:
    settings = RecallSettings()
    pool = await create_pool(
        database_url, min_size=2, max_size=4,
        server_settings=vector_search.graph_settings(settings.hnsw_ef_search),
    )
    res = ReadResources(pool=pool, embedder=load_embedder(latency=True), tokens=TokenCounter(model_dir() / "tokenizer.json"),
                        settings=settings, effects=NoEffects())  # type: ignore[arg-type]
    memories = generate(n, seed=seed)
    ids = await loaded_ids(database_url, memories, namespace)
    suite_seed = {"text": seed + 1, "keyword": seed + 2, "filtered": seed + 3}[kind]
    queries = SUITES[kind](memories, WARMUP + count, seed=suite_seed)
    ctx = ToolContext(principal=Principal.master())
    times: list[float] = []
    hits = 0
    try:
        for i, query in enumerate(queries):
            arguments = scope_query(query, namespace)
            began = time.perf_counter()
            body, _ = await recall(res, ctx, arguments)
            if i >= WARMUP:
                times.append((time.perf_counter() - began) * 1000)
                hits += ids[query.expected] in {str(f.get("id")) for f in body.get("fragments", [])}
    finally:
        await pool.close()
    line = (f"recall() in process, {kind}, n={len(times)}: p50 {percentile(times, 50):.2f}  p95 {percentile(times, 95):.2f}  "
            f"p99 {percentile(times, 99):.2f} ms, hit@10 {hits / max(len(times), 1):.3f}")
    print(line)  # noqa: T201


def compare(first: str, second: str) -> None:
    a = json.loads(Path(first).read_text())
    b = json.loads(Path(second).read_text())
    top, every, same_avgdl, tied = [], [], 0, 0
    for x, y in zip(a, b, strict=True):
        if x["query"] != y["query"]:
            raise SystemExit("the runs asked different queries")
        # Scores within 1% at every rank of the top 10 (the sampled average length moves them a little):
        # the lists differ only in which of equally scored fragments they hold.
        tied += x["ids"] != y["ids"] and len(x["scores"]) == len(y["scores"]) and all(
            abs(p - q) <= 0.01 * max(abs(p), abs(q)) for p, q in zip(x["scores"][:10], y["scores"][:10], strict=False))
        if x["ids"]:
            top.append(len(set(x["ids"][:10]) & set(y["ids"][:10])) / min(10, len(x["ids"])))
            every.append(len(set(x["ids"]) & set(y["ids"])) / len(x["ids"]))
        same_avgdl += abs(x["avgdl"] - y["avgdl"]) < 1e-9
    line = (f"{len(a)} queries: top-10 shared {sum(top) / max(len(top), 1):.3f}, all candidates shared "
            f"{sum(every) / max(len(every), 1):.3f}, same avgdl {same_avgdl}, "
            f"identical lists {sum(x['ids'] == y['ids'] for x, y in zip(a, b, strict=True))}, "
            f"different ids at the same top-10 scores (ties) {tied}")
    print(line)  # noqa: T201


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--namespace")
    parser.add_argument("--kind", choices=sorted(SUITES), default="text")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--recall", action="store_true", help="time the whole recall() and count hit@10")
    parser.add_argument("--n", type=int, default=100_000, help="with --recall: the N of the bench.recall_load run")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if not args.database_url or not args.namespace:
        parser.error("--database-url and --namespace are required to time the layer")
    if args.recall:
        asyncio.run(run_recall(args.database_url, args.namespace, args.kind, args.queries, args.seed, args.n))
        return
    saved = asyncio.run(run(args.database_url, args.namespace, args.kind, args.queries, args.seed))
    if args.out:
        Path(args.out).write_text(json.dumps(saved))


if __name__ == "__main__":
    main()
