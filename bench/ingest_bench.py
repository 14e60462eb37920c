"""Write-path benchmark through MCP: remember latency and batch_remember throughput.

    python -m bench.ingest_bench [--url URL --key KEY] [--remember 200] [--batch-fragments 4000] [--clients 2,4]
                                 [--async-fragments 2000]

Embeddings are computed synchronously by the ingest service on every write, so these
numbers include the embedding model. The first table is the model alone, in this process,
on the same corpus (EMBEDDING_BACKEND chooses it, as it does for the services): the ceiling
that the write path's throughput is measured against.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.corpus import generate
from bench.harness import (
    LATENCY_HEADER, Target, add_target_arguments, call, latency_row, mcp_session, print_table, target_from, timed_call,
)
from bench.loading import BATCH, load, run_namespace, scoped
from shared.embeddings.model import available_cores

WARMUP = 10
CORES = available_cores()


async def model_throughput(count: int, seed: int) -> list[list[str]]:
    """Texts per second through the embedder alone (wall clock and per CPU-second), cut
    into slices and run in parallel lanes exactly as the ingest service does (batches of
    200, as batch_remember)."""
    from services.ingest.service import WriteResources
    from shared.embeddings import load_embedder
    from shared.settings import embedding_settings

    texts = [f"{m.fragment['topic']}: {m.fragment['content']}" for m in generate(count, seed=seed)]
    model = WriteResources(pool=None, embedder=load_embedder())  # type: ignore[arg-type]
    await model.embed(texts[:BATCH])  # warm-up
    cpu, began = time.process_time(), time.perf_counter()
    for start in range(0, len(texts), BATCH):
        await model.embed(texts[start:start + BATCH])
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    return [[embedding_settings().backend, str(len(texts)), f"{len(texts) / wall:.0f}", f"{len(texts) / cpu:.0f}"]]


async def remember_latency(target: Target, count: int, seed: int) -> list[float]:
    memories = generate(count + WARMUP, seed=seed)
    namespace = run_namespace("remember")
    samples: list[float] = []
    async with mcp_session(target) as session:
        for i, memory in enumerate(memories):
            ms, body = await timed_call(session, "remember", scoped(memory.fragment, namespace))
            if not body.get("success"):
                raise RuntimeError(f"remember failed: {body}")
            if i >= WARMUP:
                samples.append(ms)
    return samples


async def async_throughput(target: Target, count: int, seed: int) -> tuple[float, int, int]:
    """batch_remember(async=true): all batches queued at once, timed until batch_status says
    every job completed (the worker stores them through ingest). Returns (s, processed, failed)."""
    memories = generate(count, seed=seed)
    namespace = run_namespace("async")
    fragments = [scoped(m.fragment, namespace) for m in memories]
    async with mcp_session(target) as session:
        began = time.perf_counter()
        jobs = []
        for start in range(0, len(fragments), BATCH):
            reply = await call(session, "batch_remember", {"fragments": fragments[start:start + BATCH], "async": True})
            if reply.get("jobId"):
                jobs.append(reply["jobId"])
        processed = failed = 0
        for job in jobs:
            while True:
                status = await call(session, "batch_status", {"jobId": job})
                if status.get("state") in ("completed", "dead"):
                    processed += status["processed"]
                    failed += status["failed"]
                    break
                await asyncio.sleep(0.2)
        return time.perf_counter() - began, processed, failed


async def run(target: Target, remember_count: int, batch_fragments: int, client_counts: list[int], seed: int,
              async_fragments: int = 0, model_texts: int = 0) -> None:
    if model_texts:
        print_table("embedding model alone (this process, as the ingest service runs it)",
                    ["backend", "texts", "texts/s", "texts/CPU-s"], await model_throughput(model_texts, seed))
    if remember_count:
        samples = await remember_latency(target, remember_count, seed)
        print_table("remember (sequential, one client, embeddings on)", LATENCY_HEADER, [latency_row("remember", samples)])

    rows = []
    for n, clients in enumerate(client_counts):
        # A fresh slice of the corpus per run, so nothing is deduplicated away.
        memories = generate(batch_fragments, seed=seed + 100 + n)
        result = await load(target, memories, run_namespace(f"batch{clients}"), clients)
        batch_lat = latency_row("", result.batch_ms)
        per_cpu = result.per_cpu_second
        rows.append([
            str(clients), str(len(memories)), f"{result.seconds:.1f}", f"{result.rate:.0f}",
            f"{per_cpu:.0f}" if per_cpu else "n/a", f"{per_cpu * CORES:.0f}" if per_cpu else "n/a",
            batch_lat[2], batch_lat[3], str(result.failed), str(result.duplicates),
        ])
    print_table(
        f"batch_remember sustained throughput (batches of {BATCH}, embeddings on)",
        ["clients", "fragments", "seconds", "fragments/s", "per stack CPU-s", f"x {CORES} cores", "batch p50 ms",
         "batch p95 ms", "failed", "duplicates"],
        rows,
    )
    print(f"(per stack CPU-s: fragments per CPU second of the private stack's processes -- services, Postgres, "
          f"worker -- whatever else loads the machine; x {CORES} cores: the rate those cores would give it alone)")
    if async_fragments:
        seconds, processed, failed = await async_throughput(target, async_fragments, seed + 500)
        print_table(
            "batch_remember async=true: queued to completed (worker -> ingest)",
            ["fragments", "seconds", "fragments/s", "processed", "failed"],
            [[str(async_fragments), f"{seconds:.1f}", f"{processed / seconds:.0f}", str(processed), str(failed)]],
        )


def parse_clients(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--remember", type=int, default=200, help="sequential remember calls timed (after 10 warm-up)")
    parser.add_argument("--batch-fragments", type=int, default=4000, help="fragments stored per concurrency level")
    parser.add_argument("--clients", type=parse_clients, default=[2, 4], help="concurrency levels, e.g. 2,4")
    parser.add_argument("--async-fragments", type=int, default=0, help="fragments stored with async=true (0 = skip)")
    parser.add_argument("--model-texts", type=int, default=1000, help="texts for the model-only table (0 = skip)")
    parser.add_argument("--seed", type=int, default=101)
    args = parser.parse_args(argv)
    with target_from(args) as target:
        asyncio.run(run(target, args.remember, args.batch_fragments, args.clients, args.seed, args.async_fragments,
                        args.model_texts))


if __name__ == "__main__":
    main()
