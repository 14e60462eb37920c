"""Where remember's time goes: the ingest service's own `remember()` run in this process against
a running stack's Postgres and Redis, on single LoCoMo turns, with every stage timed.

    python -m bench.remember_profile --database-url DSN --redis-url URL [--count 200]

bench.ingest_bench times remember end to end through MCP (issue 22 item 2: p95 <= 40 ms) beside
the model alone on the same turns; this one splits the difference: the tool's own total (what
the ingest service spends between its HTTP request and reply), its stages, and so what the
gateway, the two HTTP hops and the client add. Each turn goes to a fresh workspace under a new
namespace (as the bench's do), so nothing is a duplicate. Stages overlap (the model runs while
the connection looks for a stored copy), so their sum exceeds the total.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench.eval_locomo import DEV_DATA
from bench.harness import percentile
from bench.ingest_bench import locomo_memories
from bench.loading import run_namespace, scoped
from bench.recall_profile import timed_stage
from services.common.internal import ToolContext
from services.ingest import remember as remember_tool
from services.ingest import service
from services.ingest.service import WriteResources
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.embeddings import load_embedder
from shared.job_relay import OutboxRelay
from shared.jobs import broker_key
from shared.repositories import fragments as fragments_repo
from shared.repositories import outbox as outbox_repo
from shared.repositories import vector_search
from shared.settings import IngestSettings

WARMUP = 10
# Module attributes remember() reaches its stages through (names imported into remember's own
# module are timed there).
STAGES = {
    fragments_repo: ["find_duplicate", "vector_candidates", "fetch_by_ids", "insert_many"],
    outbox_repo: ["insert"],
    remember_tool: ["conflicts_for", "check_quota", "attach_hint"],
}


def _timed_sync(label: str, fn: Callable[..., Any], timings: dict[str, list[float]]) -> Any:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timings[label].append((time.perf_counter() - began) * 1000)

    return timed


async def run(database_url: str, redis_url: str, data: Path, count: int) -> None:
    timings: dict[str, list[float]] = defaultdict(list)
    for module, names in STAGES.items():
        for name in names:
            setattr(module, name, timed_stage(f"{module.__name__.rsplit('.', 1)[-1]}.{name}", getattr(module, name), timings))
    # Screening, keywords and the content's cut: CPU on the event loop before the model starts.
    remember_tool.build_fragment = _timed_sync("remember.build_fragment", remember_tool.build_fragment, timings)
    settings = IngestSettings()
    pool = await create_pool(database_url, min_size=2, max_size=4, server_settings=vector_search.graph_settings(settings.hnsw_ef_search))
    redis = Redis.from_url(redis_url)
    # Jobs are recorded under the stack's broker key (its ingest uses this Redis as its broker,
    # as `make run` and the benches' stacks do), so the stack's own relay sends them; this
    # relay is never run.
    relay = OutboxRelay(pool, broker_key(redis_url), lambda jobs: 0, poll=1.0, backoff_max=1.0)
    res = WriteResources(pool=pool, embedder=load_embedder(), settings=settings, redis=redis, relay=relay)
    res.embed_fragments = timed_stage("embed_fragments", res.embed_fragments, timings)  # type: ignore[method-assign]
    after_commit = timed_stage("after_commit", service.after_commit, timings)
    invalidate = timed_stage("invalidate_recall_cache", service.invalidate_recall_cache, timings)
    namespace = run_namespace("remember-profile")
    memories = locomo_memories(data, WARMUP + count, "prof")
    ctx = ToolContext(principal=Principal.master())
    totals: list[float] = []
    try:
        for i, memory in enumerate(memories):
            began = time.perf_counter()
            jobs = res.job_buffer()
            result, is_error = await remember_tool.remember(res, jobs, ctx, scoped(memory.fragment, namespace))
            await after_commit(res, jobs)
            await invalidate(res, ctx.principal)
            if is_error or not result.get("success"):
                raise RuntimeError(f"remember failed: {result}")
            if i == WARMUP - 1:
                timings.clear()
            elif i >= WARMUP:
                totals.append((time.perf_counter() - began) * 1000)
    finally:
        await redis.aclose()
        await pool.close()
    print(f"remember() in process, {len(totals)} LoCoMo turns: p50 {percentile(totals, 50):.1f} ms, "
          f"p95 {percentile(totals, 95):.1f} ms, mean {statistics.mean(totals):.1f}")
    print(f"{'stage':34s} {'calls':>5s} {'mean':>7s} {'p50':>7s} {'p95':>7s}")
    for label, samples in sorted(timings.items(), key=lambda kv: -sum(kv[1])):
        p50, p95 = percentile(samples, 50), percentile(samples, 95)
        print(f"{label:34s} {len(samples):5d} {statistics.mean(samples):7.2f} {p50:7.2f} {p95:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--data", default=str(DEV_DATA), help="LoCoMo samples (locomo10.json format)")
    parser.add_argument("--count", type=int, default=200, help="turns timed, after 10 warm-up")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.redis_url, Path(args.data), args.count))


if __name__ == "__main__":
    main()
