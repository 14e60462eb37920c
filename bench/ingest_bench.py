"""Write-path benchmark through MCP: remember latency and batch_remember throughput.

    python -m bench.ingest_bench [--url URL --key KEY] [--remember 200] [--batch-fragments 4000] [--clients 2,4]
                                 [--async-fragments 2000]
    python -m bench.ingest_bench --locomo [--data locomo-dev.json] [--batch-fragments 3200] [--clients 4]

Embeddings are computed synchronously by the ingest service on every write, so these
numbers include the embedding model. The first table is the model alone, in this process,
on the same corpus (EMBEDDING_BACKEND chooses it, as it does for the services): the ceiling
that the write path's throughput is measured against.

--locomo stores real conversation turns instead: the LoCoMo dev conversations' turns
(bench.locomo, `[date] Speaker: text`, as `make eval` stores them: type episode, the
workspace as topic), copied under fresh workspaces until --batch-fragments, so a turn of three
or more sentences also embeds its passages (shared.domain.passages). It prints the texts the
model embeds per fragment, the model's own texts/s on exactly those texts (this process, the
same lanes and 200-fragment batches as the ingest service, measured alone before and after
the load) and what fraction of the model's rate the whole write path reaches, and remember
p50 / p95 of single turns.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench import locomo
from bench.corpus import Memory, generate
from bench.eval_locomo import DEV_DATA
from bench.harness import (
    LATENCY_HEADER,
    Target,
    add_target_arguments,
    call,
    latency_row,
    mcp_session,
    print_table,
    target_from,
    timed_call,
)
from bench.loading import BATCH, load, run_namespace, scoped, stack_cpu_by_process
from shared.domain import passages as passages_module
from shared.embeddings.model import available_cores

WARMUP = 10
KINDS = ("ingest", "postgres", "gateway", "recall", "worker", "beat", "redis", "other")
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
    return await remember_each(target, generate(count + WARMUP, seed=seed), run_namespace("remember"))


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


def locomo_memories(data: Path, count: int, label: str) -> list[Memory]:
    """`count` LoCoMo turns as batch_remember items: each conversation's turns in order,
    copied under a fresh workspace (named by `label` and the copy) until there are enough."""
    samples = locomo.load(data)
    out: list[Memory] = []
    copy = 0
    while len(out) < count:
        for sample in samples:
            workspace = f"locomo-{label}{copy}-{sample['sample_id']}"
            for turn in locomo.turns_of(sample):
                fragment = {"content": turn.content, "topic": workspace, "type": "episode", "workspace": workspace}
                out.append(Memory(fragment=fragment, question="", slots={}))
        copy += 1
    return out[:count]


def items_of(memories: list[Memory], namespace: str = "") -> list[list[tuple[str | None, str]]]:
    """The (topic, content) pairs the ingest service embeds, per 200-item batch; the topic is
    the workspace as `scoped` names it under `namespace`."""
    return [
        [(f"{namespace}-{m.fragment['topic']}" if namespace else m.fragment["topic"], m.fragment["content"])
         for m in memories[start:start + BATCH]]
        for start in range(0, len(memories), BATCH)
    ]


def texts_per_fragment(batches: list[list[tuple[str | None, str]]]) -> float:
    """Texts the model runs per fragment: with passages pooled into the fragment's embedding
    (shared.domain.passages.pooled_inputs, where this tree has it) or embedded apart."""
    inputs = getattr(passages_module, "pooled_inputs", passages_module.embedding_inputs)
    return sum(len(inputs(b)[0]) for b in batches) / sum(len(b) for b in batches)


def embedding_work() -> Any:
    """The ingest service's embedding path (WriteResources with the configured embedder), built
    once in this process and kept for every measurement, like the service's own: a model
    loaded afresh for each measurement runs its first batches cold and understates the model
    (in session 12 that put the write path at 80-85% of a cold model)."""
    from services.ingest.service import WriteResources
    from shared.embeddings import load_embedder

    return WriteResources(pool=None, embedder=load_embedder())  # type: ignore[arg-type]


async def model_on(model: Any, batches: list[list[tuple[str | None, str]]]) -> tuple[float, float]:
    """(fragments/s, fragments per CPU-second) of the embedding work alone: the service's own
    WriteResources.embed_content on these batches, one at a time, in this process (the same
    lanes, slices and pooling as the ingest service; no database, no network)."""
    await model.embed_content(batches[0])  # warm-up (the shapes of this run's first batch)
    count = sum(len(b) for b in batches)
    cpu, began = time.process_time(), time.perf_counter()
    for items in batches:
        await model.embed_content(items)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    return count / wall, count / cpu


async def remember_each(target: Target, memories: list[Memory], namespace: str) -> list[float]:
    """`remember` each memory in turn over one session; latencies after the first WARMUP."""
    samples: list[float] = []
    async with mcp_session(target) as session:
        for i, memory in enumerate(memories):
            ms, body = await timed_call(session, "remember", scoped(memory.fragment, namespace))
            if not body.get("success"):
                raise RuntimeError(f"remember failed: {body}")
            if i >= WARMUP:
                samples.append(ms)
    return samples


async def run_locomo(target: Target, data: Path, remember_count: int, count: int, client_counts: list[int],
                     rounds: int) -> None:
    """Real conversation turns: the model alone and the write path, alternated `rounds`
    times in the same minutes, then remember latency."""
    rows: list[list[str]] = []
    breakdown: list[list[str]] = []
    work = embedding_work()
    await model_on(work, items_of(locomo_memories(data, count, "warm"), run_namespace("warm")))  # one untimed pass
    for r in range(rounds):
        for n, clients in enumerate(client_counts):
            namespace = run_namespace(f"locomo{clients}")
            memories = locomo_memories(data, count, f"r{r}n{n}c")
            batches = items_of(memories, namespace)
            per_text = texts_per_fragment(batches)
            before, before_cpu = await model_on(work, batches)
            by_process = stack_cpu_by_process()
            result = await load(target, memories, namespace, clients)
            spent = stack_cpu_by_process()
            after, after_cpu = await model_on(work, batches)
            model, model_cpu = (before + after) / 2, (before_cpu + after_cpu) / 2
            breakdown.append([f"{r}/{clients}", *(
                f"{(spent.get(kind, 0.0) - by_process.get(kind, 0.0)) / len(memories) * 1000:.2f}" for kind in KINDS
            ), f"{1000 / model_cpu:.2f}"])
            per_cpu = result.per_cpu_second
            batch_lat = latency_row("", result.batch_ms)
            rows.append([
                str(clients), str(len(memories)), f"{per_text:.2f}", f"{result.seconds:.1f}", f"{result.rate:.0f}",
                f"{min(before, after):.0f}-{max(before, after):.0f}", f"{model * per_text:.0f}",
                f"{result.rate / model:.0%}", f"{per_cpu:.0f}" if per_cpu else "n/a", f"{model_cpu:.0f}",
                f"{per_cpu / model_cpu:.0%}" if per_cpu else "n/a", batch_lat[2], batch_lat[3], str(result.failed),
            ])
    print_table(
        f"batch_remember of LoCoMo turns (batches of {BATCH}) beside the embedding work alone on the same turns",
        ["clients", "fragments", "texts/fragment", "seconds", "fragments/s", "model fragments/s", "model texts/s",
         "of model", "per stack CPU-s", "model per CPU-s", "of model (CPU)", "batch p50 ms", "batch p95 ms", "failed"],
        rows,
    )
    print_table("stack CPU per turn by process during the load, ms (round/clients; model: the model alone's CPU per turn)",
                ["round", *KINDS, "model alone"], breakdown)
    print("(model: the ingest service's embedding of exactly these turns alone in this process, before and after the "
          "load; of model: the write path's fragments/s over the model's mean; per CPU-s: fragments per CPU second "
          "of the whole private stack (services, Postgres, worker) beside the model's, robust to other load on the machine)")
    if remember_count:
        memories = locomo_memories(data, remember_count + WARMUP, "rem")
        namespace = run_namespace("locomo-remember")
        samples = await remember_each(target, memories, namespace)
        alone = await model_each(work, items_of(memories, namespace))
        print_table(f"remember of single LoCoMo turns (sequential, one client; {texts_per_fragment(items_of(memories)):.2f} "
                    "texts embedded a turn), and the model alone on each of those turns", LATENCY_HEADER,
                    [latency_row("remember", samples), latency_row("model alone", alone)])


async def model_each(work: Any, batches: list[list[tuple[str | None, str]]]) -> list[float]:
    """The embedding work of each turn on its own, as remember runs it (a batch of one), in ms;
    the floor under remember's latency. Latencies after the first WARMUP, like remember_each."""
    samples: list[float] = []
    for i, item in enumerate(item for batch in batches for item in batch):
        began = time.perf_counter()
        await work.embed_content([item])
        if i >= WARMUP:
            samples.append((time.perf_counter() - began) * 1000)
    return samples


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
    parser.add_argument("--locomo", action="store_true", help="store LoCoMo turns (real multi-sentence content) instead")
    parser.add_argument("--data", default=str(DEV_DATA), help="LoCoMo samples for --locomo (locomo10.json format)")
    parser.add_argument("--rounds", type=int, default=1, help="--locomo: model / load / model rounds per concurrency")
    args = parser.parse_args(argv)
    if args.locomo:
        with target_from(args) as target:
            asyncio.run(run_locomo(target, Path(args.data), args.remember, args.batch_fragments, args.clients, args.rounds))
        return
    with target_from(args) as target:
        asyncio.run(run(target, args.remember, args.batch_fragments, args.clients, args.seed, args.async_fragments,
                        args.model_texts))


if __name__ == "__main__":
    main()
