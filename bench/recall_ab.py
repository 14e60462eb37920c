"""Two versions of one function on recall's path, alternated query by query in one process: which
costs Postgres, and this process, the less CPU a recall, and which answers sooner.

    python -m bench.recall_ab --database-url DSN --redis-url URL --namespace NS \\
        --swap shared/repositories/vector_search.py:nearest [--rev HEAD] [--kind filtered] [--queries 300] [--seed S]

A is the function as it is at REV (`git show REV:PATH`, loaded as a module of its own), B as it is
in the working tree. recall() runs in this process against a running stack's Postgres and Redis
(NS from an earlier `bench.recall_load` / `bench.growth_bench` load), and query i takes A or B in
ABBA order, so that the machine's drift in speed (~2x between stretches here) falls on both alike.
A recall's Postgres CPU is what the pool's own backends used during it (their utime + stime from
/proc, clock ticks summed over many recalls); through MCP the same difference is lost among the
other processes' spread (bench/README.md, session 39).

The swap sets the attribute on the working tree's module, so a caller that reaches the function
through its module (`vector_search.nearest(...)`) takes the version of the query; a name bound by
`from ... import` elsewhere keeps B. REV's module imports the working tree's other modules.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench.harness import percentile, print_table
from bench.loading import cpu_seconds
from bench.recall_bench import scope_query
from bench.recall_profile import SUITES, WARMUP, read_resources, suite_queries, timed_stage
from services.common.internal import ToolContext
from services.recall.service import recall
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.repositories import vector_search
from shared.settings import RecallSettings

ROOT = Path(__file__).resolve().parents[1]
# The pool's connections: recall holds two at once (the vector layer's beside the lexical one).
POOL_SIZE = 4
ORDER = "ABBA"


def module_at(rev: str, path: str, root: Path = ROOT) -> types.ModuleType:
    """The module at `path` (relative to the repository at `root`) as it is at git revision
    `rev`, loaded apart from the working tree's (its name ends in @REV)."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True, text=True).stdout
    module = types.ModuleType(f"{_module_name(path)}@{rev}")
    module.__file__ = str(root / path)
    # Registered under its own name: a dataclass looks its module up in sys.modules.
    sys.modules[module.__name__] = module
    exec(compile(source, f"{path}@{rev}", "exec"), module.__dict__)
    return module


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def variant(i: int) -> str:
    """The version query i takes: A and B in ABBA order."""
    return ORDER[i % len(ORDER)]


def backends_cpu(pids: list[int]) -> float:
    """The CPU the pool's backends (`pids`) have used so far."""
    return sum(cpu_seconds(pid) for pid in pids)


@contextmanager
def swapped(module: types.ModuleType, name: str) -> Iterator[Callable[[Any], None]]:
    """A setter of `module`.`name`, which is put back as it was on exit."""
    original = getattr(module, name)
    try:
        yield lambda value: setattr(module, name, value)
    finally:
        setattr(module, name, original)


async def run(
    database_url: str, redis_url: str, namespace: str, swap: str, rev: str, kind: str, count: int, seed: int,
) -> None:
    path, name = swap.rsplit(":", 1)
    live = importlib.import_module(_module_name(path))
    versions = {"A": getattr(module_at(rev, path), name), "B": getattr(live, name)}
    settings = RecallSettings()
    pool = await create_pool(database_url, min_size=POOL_SIZE, max_size=POOL_SIZE,
                             server_settings=vector_search.graph_settings(settings.hnsw_ef_search))
    held = [await pool.acquire() for _ in range(POOL_SIZE)]
    backends = [int(await conn.fetchval("SELECT pg_backend_pid()")) for conn in held]
    for conn in held:
        await pool.release(conn)
    redis = Redis.from_url(redis_url)
    res = read_resources(pool, redis, settings, "recall-ab")
    queries = suite_queries(kind, count, seed)  # the corpus and query seeds as bench.recall_profile takes them
    ctx = ToolContext(principal=Principal.master())
    calls: dict[str, list[float]] = {"A": [], "B": []}
    wall: dict[str, list[float]] = {"A": [], "B": []}
    postgres: dict[str, list[float]] = {"A": [], "B": []}
    own: dict[str, list[float]] = {"A": [], "B": []}
    instrumented = {v: timed_stage(v, fn, calls) for v, fn in versions.items()}
    try:
        with swapped(live, name) as put:
            for i, query in enumerate(queries):
                v = variant(i)
                put(instrumented[v])
                arguments = scope_query(query, namespace)
                seen = len(calls[v])
                pg0, own0, began = backends_cpu(backends), time.process_time(), time.perf_counter()
                await recall(res, ctx, arguments)
                ended, own1, pg1 = time.perf_counter(), time.process_time(), backends_cpu(backends)
                if i < WARMUP:
                    del calls[v][seen:]
                    continue
                wall[v].append((ended - began) * 1000)
                postgres[v].append((pg1 - pg0) * 1000)
                own[v].append((own1 - own0) * 1000)
    finally:
        await redis.aclose()
        await pool.close()
    rows = []
    for v in ("A", "B"):
        rows.append([
            v, str(len(wall[v])), f"{percentile(wall[v], 50):.1f}", f"{percentile(wall[v], 95):.1f}", f"{statistics.mean(wall[v]):.1f}",
            f"{statistics.mean(postgres[v]):.2f}", f"{statistics.mean(own[v]):.2f}",
            f"{statistics.mean(calls[v]):.2f}" if calls[v] else "-", f"{percentile(calls[v], 95):.2f}" if calls[v] else "-",
        ])
    title = f"{kind} recalls in process, {name} at {rev} (A) against the working tree (B), {ORDER} query by query, seed {seed}"
    header = ["version", "n", "p50 ms", "p95 ms", "mean ms", "Postgres CPU ms", "own CPU ms", f"{name} mean", f"{name} p95"]
    print_table(title, header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--swap", required=True, metavar="PATH:FUNCTION", help="e.g. shared/repositories/vector_search.py:nearest")
    parser.add_argument("--rev", default="HEAD", help="the git revision A is taken from")
    parser.add_argument("--kind", choices=sorted(SUITES), default="filtered")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.redis_url, args.namespace, args.swap, args.rev, args.kind, args.queries, args.seed))


if __name__ == "__main__":
    main()
