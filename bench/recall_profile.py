"""Where recall's time goes: the recall service's own `recall()` run in this process against a
running stack's Postgres and Redis, with every stage timed.

    python -m bench.recall_profile --database-url DSN --redis-url URL --namespace NS [--kind text|keyword|filtered]

NS is the namespace of an earlier `bench.recall_load` run (it prints it; `--reuse NS` reruns
the MCP timings). The end-to-end numbers come from bench.recall_load / bench.recall_bench;
this one answers which stage to work on, on average and in the slowest queries (`--slowest`
of them listed with their stages). Stages overlap (the query embedding runs while the lexical
SQL does), so their sum exceeds the total.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import asyncpg
from redis.asyncio import Redis

from bench.corpus import Query, filtered_queries, generate, keyword_queries, text_queries
from bench.harness import percentile
from bench.recall_bench import scope_query
from services.common.internal import ToolContext
from services.recall import meta as meta_mod
from services.recall import render, service
from services.recall.effects import SideEffects
from services.recall.search import DocumentFrequencies
from services.recall.service import ReadResources, recall
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, model_dir
from shared.repositories import fragments as fragments_repo
from shared.repositories import recall_views, retrieval, vector_search
from shared.settings import RecallSettings

WARMUP = 30
SUITES: dict[str, Callable[..., Any]] = {"text": text_queries, "keyword": keyword_queries, "filtered": filtered_queries}
STAGES = {
    retrieval: ["query_terms", "document_frequencies", "bm25_candidates", "graph_neighbours", "turn_neighbours",
                "pool_rows", "content_terms", "term_counts", "count_in_scope", "stop_lexemes"],
    vector_search: ["nearest"],
    fragments_repo: ["fetch_by_ids"],
    recall_views: ["latest_seq", "still_fresh", "meta_facts", "links_of"],
    meta_mod: ["hints", "suggestion"],
    render: ["decorate"],
    service: ["_search", "current_generation"],
}


def read_resources(
    pool: asyncpg.Pool, redis: Redis, settings: RecallSettings, replica: str, local_df: bool = False,
) -> ReadResources:
    """What the recall service's recall() reads with, built as the service builds it, on this
    process's `pool` and `redis` (`local_df`: document frequencies counted here only)."""
    return ReadResources(
        pool=pool, embedder=load_embedder(latency=True), tokens=TokenCounter(model_dir() / "tokenizer.json"),
        settings=settings, effects=SideEffects(pool, redis, replica=replica), redis=redis,
        df_cache=DocumentFrequencies(None if local_df else redis),
    )


def suite_queries(kind: str, count: int, seed: int) -> list[Query]:
    """The `kind` suite's questions (after WARMUP more) about the 100k corpus of `seed`."""
    query_seed = {"text": seed + 1, "keyword": seed + 2, "filtered": seed + 3}[kind]
    return SUITES[kind](generate(100_000, seed=seed), WARMUP + count, seed=query_seed)


def timed_stage(
    label: str, fn: Callable[..., Any], timings: dict[str, list[float]], spans: list[tuple[str, float, float]] | None = None,
) -> Any:
    """`fn` (a coroutine function) wrapped to add each call's duration to `timings` and, with
    `spans`, its (label, start, end) in perf_counter seconds there, from which a query's
    timeline is read."""

    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            ended = time.perf_counter()
            timings[label].append((ended - began) * 1000)
            if spans is not None:
                spans.append((label, began, ended))

    return timed


def _instrument(timings: dict[str, list[float]], spans: list[tuple[str, float, float]]) -> None:
    for module, names in STAGES.items():
        for name in names:
            label = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
            setattr(module, name, timed_stage(label, getattr(module, name), timings, spans))


async def run(
    database_url: str, redis_url: str, namespace: str, kind: str, count: int, seed: int, slowest: int, local_df: bool = False,
    show_timeline: bool = False,
) -> None:
    timings: dict[str, list[float]] = defaultdict(list)
    spans: list[tuple[str, float, float]] = []
    _instrument(timings, spans)
    settings = RecallSettings()
    pool = await create_pool(
        database_url, min_size=2, max_size=4,
        server_settings=vector_search.graph_settings(settings.hnsw_ef_search),
    )
    redis = Redis.from_url(redis_url)
    res = read_resources(pool, redis, settings, "profile", local_df)

    # embed_queries of one text calls embed_query (the instance's, so the timed one): both
    # spans then cover the same run of the model.
    res.embed_query = timed_stage("embed_query", res.embed_query, timings, spans)  # type: ignore[method-assign]
    res.embed_queries = timed_stage("embed_queries", res.embed_queries, timings, spans)  # type: ignore[method-assign]
    queries = suite_queries(kind, count, seed)
    ctx = ToolContext(principal=Principal.master())
    totals = []
    # per measured query: its total, its stages' sums and its stages' (label, start, end) in ms from its start
    slow: list[tuple[float, dict[str, float], list[tuple[str, float, float]]]] = []
    try:
        for i, query in enumerate(queries):
            arguments = scope_query(query, namespace)
            seen = {label: len(samples) for label, samples in timings.items()}
            spans.clear()
            began = time.perf_counter()
            await recall(res, ctx, arguments)
            if i == WARMUP - 1:
                timings.clear()
            elif i >= WARMUP:
                totals.append((time.perf_counter() - began) * 1000)
                stages = {label: sum(samples[seen.get(label, 0):]) for label, samples in timings.items()}
                timeline = [(label, (start - began) * 1000, (end - began) * 1000) for label, start, end in spans]
                slow.append((totals[-1], stages, timeline))
    finally:
        await redis.aclose()
        await pool.close()
    print(f"recall() in process, {kind}, n={len(totals)}: p50 {percentile(totals, 50):.1f} ms, p95 {percentile(totals, 95):.1f} ms")
    print(f"the {slowest} slowest, their stages of 1 ms or more (ms):")
    for total, stages, timeline in sorted(slow, key=lambda q: -q[0])[:slowest]:
        parts = ", ".join(f"{label.rsplit('.', 1)[-1]} {ms:.1f}" for label, ms in sorted(stages.items(), key=lambda kv: -kv[1]) if ms >= 1)
        print(f"  {total:6.1f}: {parts}")
        if show_timeline:
            steps = sorted(timeline, key=lambda span: span[1])
            print("          " + ", ".join(f"{label.rsplit('.', 1)[-1]} {start:.1f}-{end:.1f}" for label, start, end in steps))
    if show_timeline:
        # On the critical path: what the query waits for after the vector layer answers.
        after = [total - max((end for label, _, end in timeline if label == "vector_search.nearest"), default=total)
                 for total, _, timeline in slow]
        print(f"after nearest() answered, to recall()'s return: p50 {percentile(after, 50):.1f}, p95 {percentile(after, 95):.1f} ms")
    print(f"{'stage':32s} {'calls':>5s} {'mean':>7s} {'p50':>7s} {'p95':>7s}")
    for label, samples in sorted(timings.items(), key=lambda kv: -sum(kv[1])):
        print(f"{label:32s} {len(samples):5d} {statistics.mean(samples):7.2f} {percentile(samples, 50):7.2f} {percentile(samples, 95):7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--kind", choices=sorted(SUITES), default="text")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--slowest", type=int, default=8, help="queries whose stages are listed one by one, slowest first")
    parser.add_argument("--local-df", action="store_true",
                        help="count document frequencies in this process only, without the replicas' shared counts in Redis")
    parser.add_argument("--timeline", action="store_true",
                        help="print each slow query's stages as start-end (ms from its start), and the time after nearest()")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.redis_url, args.namespace, args.kind, args.queries, args.seed, args.slowest,
                    args.local_df, args.timeline))


if __name__ == "__main__":
    main()
