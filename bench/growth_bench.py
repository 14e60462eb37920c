"""The cost curve in one run: grow one store through 10k, 100k and 1M fragments and, at each
size, time recall through MCP, measure ingest through MCP, and read disk and memory.

    python -m bench.growth_bench [--sizes 10000,100000,1000000] [--data-dir DIR] [--serve]

At each size the store is first topped up with the bulk loader of `bench.recall_load` (the
repository's own insert, `--embed-share` of the rows embedded by the model, the rest real
vectors perturbed), then:

- ingest: `--ingest-sample` fresh corpus fragments through `batch_remember` with four MCP
  clients (every one embedded by the model, links and all), fragments/s and the stack's CPU
  seconds per fragment;
- recall: the text, keyword and filtered suites of `bench.recall_bench` over everything
  loaded so far, one client, after a warm-up;
- disk: the database's size and the big relations (fragments with their HNSW index,
  postings, passages), also per million fragments;
- memory: proportional set size (PSS, so Postgres' shared buffers count once) of Postgres,
  Redis and each service.

The stack is private (free ports) and lives in `--data-dir` (a temp dir by default). With
`--serve` it stays up after the last table until Ctrl-C, its address written to
`--details` (with its Redis, the namespace and the corpus' size and seed), so other benches can be
pointed at the grown store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench.corpus import Memory, filtered_queries, generate, keyword_queries, text_queries
from bench.harness import LATENCY_HEADER, Target, latency_row, percentile, print_table, private_stack_config
from bench.loading import load, run_namespace, stack_cpu_by_process
from bench.recall_bench import WARMUP, time_queries
from bench.recall_load import CPU_HEADER, bulk_load, cpu_row
from services.stack.supervisor import Stack, interrupt_on_stop_signals
from shared.db import SEARCH_PATH
from shared.repositories import type_graphs, vector_cells
from shared.settings import MaintenanceSettings

INGEST_CLIENTS = 4
# The maintenance worker's default (TYPE_GRAPH_MIN_ROWS).
TYPE_GRAPH_MIN_ROWS: int = MaintenanceSettings.model_fields["type_graph_min_rows"].default
VECTOR_CELLS_MIN_ROWS: int = MaintenanceSettings.model_fields["vector_cells_min_rows"].default
VECTOR_CELLS_RETRAIN_GROWTH: float = MaintenanceSettings.model_fields["vector_cells_retrain_growth"].default
# A top-up of at least this share of the store's rows drops the indexes that carry the
# embedding (the HNSW graph and fragments_scope_vectors, migration 0026) and builds them again
# afterwards (same definitions): inserting into the graph row by row is most of a bulk load's
# cost (~550/s at 1M against ~1,000/s at the start), and the covering btree takes 1.6 KB a row
# in scope order, not the load's; one parallel build of each is far cheaper (the scope index:
# 41 s at 1M in session 13). The store measured afterwards is the same; only the load is faster.
REBUILD_SHARE = 1.0
# For the rebuild: the graph of 1M 384-d vectors fits in memory, so the build stays in phase one.
BUILD_MEMORY = "4GB"
# Bulk loaders at once, each its own connection: one insert backend is one core (the postings
# trigger, passages, indexes), and the loader's own model share runs beside it. Session 13: one
# loader with HNSW live ~150/s; the last 744k of a 1M load with two and HNSW dropped, 235/s
# beside a CI run, then the HNSW build 522 s.
LOADERS = 2
# The relations whose growth is the store's cost (tables with their indexes and TOAST).
RELATIONS = ("fragments", "fragment_terms", "fragment_passages", "fragment_links")


@dataclass
class Step:
    size: int
    load_seconds: float
    ingest_rate: float
    ingest_cpu_ms: float | None
    ingest_batch_p95: float
    recall: dict[str, tuple[list[float], float]] = field(default_factory=dict)
    disk: dict[str, int] = field(default_factory=dict)
    pss: dict[str, int] = field(default_factory=dict)
    recall_cpu: list[list[str]] = field(default_factory=list)  # recall_load.cpu_row per suite


def _pss_bytes(pid: int) -> int:
    """Proportional set size of one process (shared pages split among their users)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == pid:
            out.append(int(name))
    return out


def memory_by_process(stack: Stack) -> dict[str, int]:
    """PSS by process name; Postgres counts its postmaster and every backend."""
    out: dict[str, int] = {}
    for name, pid in stack.pids().items():
        pids = [pid, *_children(pid)] if name == "postgres" else [pid]
        out[name] = sum(_pss_bytes(p) for p in pids)
    return out


async def disk_usage(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        out = {"database": int(await conn.fetchval("SELECT pg_database_size(current_database())"))}
        for rel in RELATIONS:
            out[rel] = int(await conn.fetchval("SELECT coalesce(pg_total_relation_size(to_regclass($1)), 0)", rel))
        out["fragments rows"] = int(await conn.fetchval("SELECT count(*) FROM fragments"))
        return out
    finally:
        await conn.close()


async def top_up(database_url: str, memories: list[Memory], namespace: str, embed_share: float, have: int) -> tuple[list[str], float]:
    """Bulk-load `memories` with LOADERS connections at once; a top-up at least REBUILD_SHARE
    of what the store holds (the first load always) goes in without the embedding indexes, which are
    then built again with their original definitions; every top-up ends in a VACUUM (ANALYZE)."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        rebuild = len(memories) >= have * REBUILD_SHARE
        definitions = []
        if rebuild:
            definitions = [r["indexdef"] for r in await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
                " AND tablename = 'fragments' AND (indexdef ILIKE '%USING hnsw%' OR indexdef ILIKE '%INCLUDE (%embedding%')"
            )]
            for definition in definitions:
                name = definition.split(" INDEX ", 1)[1].split(" ON ", 1)[0].strip()
                await conn.execute(f"DROP INDEX {name}")
        began = time.perf_counter()
        share = -(-len(memories) // LOADERS)
        loaded = await asyncio.gather(*(
            bulk_load(database_url, memories[start:start + share], namespace, embed_share)
            for start in range(0, len(memories), share)
        ))
        ids = [fid for part, _ in loaded for fid in part]  # in the corpus' order: the parts are in order
        seconds = time.perf_counter() - began
        began = time.perf_counter()
        await conn.execute(f"SET maintenance_work_mem = '{BUILD_MEMORY}'")
        await conn.execute("SET max_parallel_maintenance_workers = 2")
        for definition in definitions:
            await conn.execute(definition)
        if definitions:
            built = time.perf_counter() - began
            print(f"  {len(definitions)} embedding indexes built again in {built:.0f} s", flush=True)
            seconds += built
        # What autovacuum would do over the next minutes, done before anything is timed: the
        # visibility map (without it the scope index's index-only scans read the heap row by
        # row) and the planner's statistics of the grown tables. Session 13's first MCP passes
        # after a load ran into multi-second stalls in every suite.
        began = time.perf_counter()
        await conn.execute("VACUUM (ANALYZE) fragments, fragment_terms, fragment_passages")
        print(f"  VACUUM (ANALYZE) in {time.perf_counter() - began:.0f} s", flush=True)
        # The type graphs the maintenance worker would build within its next interval (the
        # types past TYPE_GRAPH_MIN_ROWS now) and its cells index (past VECTOR_CELLS_MIN_ROWS),
        # built here so that nothing is timed beside them.
        began = time.perf_counter()
        built_types = await type_graphs.ensure_type_graphs(conn, TYPE_GRAPH_MIN_ROWS, concurrently=False)
        if built_types:
            print(f"  type graphs {', '.join(built_types)} built in {time.perf_counter() - began:.0f} s", flush=True)
        began = time.perf_counter()
        # A stage past twice the last one's rows trains new cells, as the worker would: two
        # runs, the second retiring the version the first superseded.
        version = None
        for _ in range(2):
            built = await vector_cells.ensure_cells(
                conn, VECTOR_CELLS_MIN_ROWS, retrain_growth=VECTOR_CELLS_RETRAIN_GROWTH, concurrently=False)
            version = built if built is not None else version
        if version is not None:
            print(f"  vector cells v{version} trained and built in {time.perf_counter() - began:.0f} s", flush=True)
        return ids, seconds
    finally:
        await conn.close()


async def measure(
    stack: Stack, target: Target, memories: list[Memory], ids: list[str | None], namespace: str,
    extra: list[Memory], queries: int, seed: int,
) -> tuple[float, float | None, float, dict[str, tuple[list[float], float]], list[list[str]]]:
    loaded = await load(target, extra, run_namespace("growth-ingest"), INGEST_CLIENTS)
    if loaded.failed:
        raise SystemExit(f"{loaded.failed} fragments failed to store during the ingest sample")
    cpu_ms = loaded.stack_cpu / len(extra) * 1000 if loaded.stack_cpu else None
    # Let the worker's link jobs for the sample drain before recall is timed.
    await asyncio.sleep(10)
    suites = {
        "text": text_queries(memories, WARMUP + queries, seed=seed + 1),
        "keyword": keyword_queries(memories, WARMUP + queries, seed=seed + 2),
        "filtered": filtered_queries(memories, WARMUP + queries, seed=seed + 3),
    }
    recall, cpu = {}, []
    for name, suite in suites.items():
        await time_queries(target, suite[:WARMUP], namespace, ids)
        before, client = stack_cpu_by_process(), time.process_time()
        recall[name] = await time_queries(target, suite[WARMUP:], namespace, ids)
        if before:
            cpu.append(cpu_row(name, before, stack_cpu_by_process(), time.process_time() - client, len(recall[name][0])))
        row = latency_row(name, recall[name][0], f"hit@10 {recall[name][1]:.2f}")
        print(f"  recall {' '.join(row)}", flush=True)
    return loaded.rate, cpu_ms, percentile(loaded.batch_ms, 95), recall, cpu


def report(steps: list[Step]) -> None:
    rows = []
    for s in steps:
        for name, (samples, hit) in s.recall.items():
            rows.append(latency_row(f"{s.size:>9,} {name}", samples, f"hit@10 {hit:.2f}"))
    print_table("recall through MCP by store size (one client, pageSize 10)", LATENCY_HEADER, rows)
    cpu_rows = [[f"{s.size:>9,} {row[0]}", *row[1:]] for s in steps for row in s.recall_cpu]
    if cpu_rows:
        print_table("CPU per recall by process, ms (client: this process, the MCP client library's own)", CPU_HEADER, cpu_rows)
    print_table(
        f"ingest through MCP by store size (batch_remember x200, {INGEST_CLIENTS} clients, every fragment embedded)",
        ["size", "fragments/s", "stack CPU ms / fragment", "batch p95 ms", "bulk top-up s"],
        [[f"{s.size:,}", f"{s.ingest_rate:.0f}", f"{s.ingest_cpu_ms:.2f}" if s.ingest_cpu_ms else "n/a",
          f"{s.ingest_batch_p95:.0f}", f"{s.load_seconds:.0f}"] for s in steps],
    )
    gib = 1024 ** 3
    disk_rows = []
    for s in steps:
        rows_n = max(s.disk.get("fragments rows", s.size), 1)
        per_m = s.disk["database"] / rows_n * 1_000_000 / gib
        disk_rows.append([f"{s.size:,}", f"{s.disk['database'] / gib:.2f}", f"{per_m:.1f}",
                          *(f"{s.disk[r] / gib:.2f}" for r in RELATIONS)])
    print_table("disk (GiB; per million = database size / rows x 1M)",
                ["size", "database", "per 1M", *RELATIONS], disk_rows)
    names = sorted({n for s in steps for n in s.pss})
    print_table("memory, proportional set size (MiB)", ["size", *names, "total"],
                [[f"{s.size:,}", *(f"{s.pss.get(n, 0) / 2**20:.0f}" for n in names),
                  f"{sum(s.pss.values()) / 2**20:.0f}"] for s in steps])


async def grow(
    stack: Stack, sizes: list[int], queries: int, embed_share: float, ingest_sample: int, seed: int, namespace: str,
) -> list[Step]:
    target = Target(stack.mcp_url, stack.master_key)
    started = time.perf_counter()
    memories = generate(sizes[-1], seed=seed)
    # A disjoint corpus for the ingest samples (another seed; content_hash is per workspace anyway).
    extra = generate(ingest_sample * len(sizes), seed=seed + 1000)
    print(f"generated {len(memories)} + {len(extra)} fragments in {time.perf_counter() - started:.0f} s", flush=True)
    ids: list[str | None] = []
    steps = []
    for i, size in enumerate(sizes):
        new_ids, seconds = await top_up(stack.database_url, memories[len(ids):size], namespace, embed_share, len(ids))
        ids.extend(new_ids)
        print(f"store at {size:,} (+{len(new_ids):,} in {seconds:.0f} s)", flush=True)
        sample = extra[i * ingest_sample:(i + 1) * ingest_sample]
        rate, cpu_ms, batch_p95, recall, recall_cpu = await measure(stack, target, memories[:size], ids, namespace, sample, queries, seed)
        print(f"  ingest {rate:.0f} fragments/s", flush=True)
        step = Step(size, seconds, rate, cpu_ms, batch_p95, recall, await disk_usage(stack.database_url), memory_by_process(stack),
                    recall_cpu)
        steps.append(step)
        report(steps)
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="store sizes to measure at, ascending")
    parser.add_argument("--queries", type=int, default=200, help="measured queries per suite and size")
    parser.add_argument("--embed-share", type=float, default=0.1, help="share of bulk-loaded rows the model embeds")
    parser.add_argument("--ingest-sample", type=int, default=2000, help="fragments stored through MCP at each size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", help="where the stack keeps its data (default: a temp dir, removed after)")
    parser.add_argument("--serve", action="store_true", help="keep the stack up after the run until Ctrl-C")
    parser.add_argument("--details", default="growth_stack.json", help="with --serve: where its address is written")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    # Under /tmp by default: embedded Postgres makes its data dir's parents world-readable.
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="engram-growth-", dir="/tmp"))
    print(f"Engram growth bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, data in {data_dir}", flush=True)
    try:
        config = private_stack_config(data_dir / "stack")
        # A batch of 200 real turns can take longer than the gateway's default 30 s to ingest on
        # a busy 2-core machine; the bench measures rates, not timeouts.
        config.extra_env["UPSTREAM_TIMEOUT"] = "PT300S"
        interrupt_on_stop_signals()
        with Stack(config) as stack:
            # Printed now and kept in the details: other benches reach the grown store by it
            # (`bench.recall_load --reuse`, `bench.recall_profile --namespace`).
            namespace = run_namespace("growth")
            print(f"loading into namespace {namespace}", flush=True)
            asyncio.run(grow(stack, sizes, args.queries, args.embed_share, args.ingest_sample, args.seed, namespace))
            if args.serve:
                Path(args.details).write_text(json.dumps(
                    {"mcp_url": stack.mcp_url, "key": stack.master_key, "database_url": stack.database_url,
                     "redis_url": stack.redis_url, "namespace": namespace, "n": sizes[-1], "seed": args.seed,
                     "data_dir": str(data_dir)}, indent=2) + "\n")
                print(f"serving {stack.mcp_url} (details in {args.details}); Ctrl-C stops it", flush=True)
                print(f"warm passes: python -m bench.recall_load --url {stack.mcp_url} --key {stack.master_key}"
                      f" --database-url {stack.database_url} --reuse {namespace} --n {sizes[-1]} --seed {args.seed}",
                      flush=True)
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
