"""Load, scaled out (issue 21): a fixed offered load of MCP `recall` and `remember` calls on
loopback against 1 and 2 recall replicas behind 1 and 2 gateways.

    python -m bench.scale_bench [--rates 4,8] [--duration 20] [--remember-share 0.2] [--configs 1x1,2x1,1x2,2x2] [--rounds 2]

One private stack (embedded Postgres, Redis, two recall processes, ingest, worker, beat); per
configuration RxG it starts G fresh gateway processes whose RECALL_URL lists the first R recall
replicas (the gateway spreads calls over that list, as a Kubernetes Service spreads them over
pods), and the client spreads its MCP sessions over the G gateways (a load balancer without
affinity; any gateway serves any session, sessions live in Redis). The load is open-loop: a
call starts every 1/rate s whether or not the earlier ones have answered (a closed loop would
slow down with the server and hide queueing), so the latencies include the queueing a slow
configuration builds. Per configuration and rate: calls sent and answered, throughput (answered
per second of the window), p50 / p95 / p99 per tool, errors (tool errors, transport errors and
timeouts: must be 0), the machine's CPU use during the window, and each process's RSS.

The corpus is bench/corpus.py's (same seed, same texts), `--seed-memories` of it stored first
through batch_remember so recall searches a non-trivial store. The gateways' rate limits are
raised for the run: one client at 16 calls/s is past the per-key default of 1200 a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import psutil
from mcp import ClientSession

from bench.corpus import Memory, generate, text_queries
from bench.harness import percentile, print_table
from bench.loading import scoped
from services.stack import client
from services.stack.supervisor import ServiceProcess, Stack, StackConfig, free_port

MASTER_KEY = "bench-scale-master-key"
NAMESPACE = "scale"
# Per-key and per-IP limits of the bench's gateways: the bench is one client and one key.
UNLIMITED = "1000000"
# A call that takes longer than this counts as an error (and is not a latency sample).
CALL_TIMEOUT_S = 30.0
# Calls in flight at most; past it a call is counted as shed (an error), so an overloaded
# configuration shows up as errors instead of an ever-growing queue in the client.
MAX_IN_FLIGHT = 256


@dataclass
class Sample:
    tool: str
    started: float
    ms: float | None  # None: failed
    error: str | None = None


@dataclass
class RunResult:
    config: str
    rate: float
    window_s: float
    samples: list[Sample] = field(default_factory=list)
    cpu_percent: float = float("nan")

    def ok(self, tool: str | None = None) -> list[float]:
        return [s.ms for s in self.samples if s.ms is not None and (tool is None or s.tool == tool)]

    @property
    def errors(self) -> list[Sample]:
        return [s for s in self.samples if s.ms is None]


def stack_config(data_dir: Path) -> StackConfig:
    return StackConfig(
        data_dir=data_dir,
        gateway_port=free_port(),
        recall_ports=[free_port(), free_port()],
        ingest_port=free_port(),
        pg_port=free_port(),
        redis_port=free_port(),
        worker_metrics_port=free_port(),
        master_key=MASTER_KEY,
        extra_env={
            "ENGRAM_ENV": "test", "LOG_LEVEL": "WARNING",
            "RATE_LIMIT_PER_IP_PER_MIN": UNLIMITED, "RATE_LIMIT_PER_KEY_PER_MIN": UNLIMITED,
        },
    )


def start_gateways(stack: Stack, recalls: int, gateways: int, tag: str) -> list[tuple[ServiceProcess, str]]:
    started = []
    for i in range(gateways):
        port = free_port()
        # The stack's own launcher, as tests/gateway does.
        proc = stack._uvicorn(
            f"gateway-{tag}-{i}", "services.gateway.app", port,
            {"MEMENTO_ACCESS_KEY": stack.master_key, "RECALL_URL": ",".join(stack.recall_urls[:recalls]), "INGEST_URL": stack.ingest_url},
        )
        proc.start()
        started.append((proc, f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 120
    for proc, url in started:
        while True:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited; see {proc.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} not healthy; see {proc.log_path}")
            time.sleep(0.2)
    return started


@asynccontextmanager
async def sessions_on(urls: list[str], per_gateway: int) -> AsyncIterator[list[ClientSession]]:
    async with AsyncExitStack() as stack:
        opened = []
        for _ in range(per_gateway):
            for url in urls:
                opened.append(await stack.enter_async_context(client.mcp_session(f"{url}/mcp", MASTER_KEY, timeout=CALL_TIMEOUT_S)))
        yield opened


async def one_call(session: ClientSession, tool: str, arguments: dict[str, object], sink: list[Sample]) -> None:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            result = await session.call_tool(tool, arguments)
    except TimeoutError:
        sink.append(Sample(tool, started, None, "timeout"))
        return
    except Exception as exc:  # noqa: BLE001 - a bench counts every failure as an error, whatever its kind
        sink.append(Sample(tool, started, None, type(exc).__name__))
        return
    ms = (time.perf_counter() - started) * 1000
    if getattr(result, "is_error", False):
        text = result.content[0].text if result.content else ""
        sink.append(Sample(tool, started, None, f"tool error: {text[:120]}"))
    else:
        sink.append(Sample(tool, started, ms))


async def offered_load(
    sessions: list[ClientSession], rate: float, seconds: float, remember_share: float,
    memories: list[Memory], queries: list[dict[str, object]], rng: random.Random,
) -> list[Sample]:
    """Start one call every 1/rate s for `seconds`, round-robin over the sessions; wait for
    the last ones to answer."""
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    interval = 1.0 / rate
    began = time.perf_counter()
    n = 0
    while (due := began + n * interval) < began + seconds:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        session = sessions[n % len(sessions)]
        if rng.random() < remember_share:
            memory = memories[rng.randrange(len(memories))]
            # A new text each time: a verbatim repeat would be answered as a duplicate.
            fragment = scoped(memory.fragment, NAMESPACE) | {"content": f"{memory.fragment['content']} (load note {n})"}
            fragment.pop("keywords", None)
            tool, arguments = "remember", fragment
        else:
            tool, arguments = "recall", queries[rng.randrange(len(queries))]
        if len(tasks) >= MAX_IN_FLIGHT:
            samples.append(Sample(tool, time.perf_counter(), None, "shed: too many calls in flight"))
        else:
            task = asyncio.create_task(one_call(session, tool, arguments, samples))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        n += 1
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=CALL_TIMEOUT_S + 5)
        for task in pending:  # past its own timeout: counted, never waited for
            task.cancel()
            samples.append(Sample("?", time.perf_counter(), None, "unfinished"))
    return samples


async def seed_store(url: str, memories: list[Memory]) -> None:
    async with client.mcp_session(f"{url}/mcp", MASTER_KEY, timeout=300) as session:
        for start in range(0, len(memories), 100):
            batch = [scoped(m.fragment, NAMESPACE) for m in memories[start:start + 100]]
            result = await session.call_tool("batch_remember", {"fragments": batch})
            if getattr(result, "is_error", False):
                raise RuntimeError(f"seeding failed: {result.content[0].text[:300]}")


def process_rss(stack: Stack, extra: list[ServiceProcess]) -> dict[str, float]:
    """Resident MiB per process (the worker with its pool children)."""
    out: dict[str, float] = {}
    for proc in [*stack.processes.values(), *extra]:
        if proc.process is None or not proc.alive():
            continue
        try:
            root = psutil.Process(proc.process.pid)
            family = [root, *root.children(recursive=True)]
            out[proc.name] = sum(p.memory_info().rss for p in family) / 2**20
        except psutil.Error:
            continue
    return out


async def run_config(
    stack: Stack, recalls: int, gateways: int, rates: list[float], args: argparse.Namespace,
    memories: list[Memory], queries: list[dict[str, object]],
) -> tuple[list[RunResult], dict[str, float]]:
    tag = f"{recalls}x{gateways}"
    started = await asyncio.to_thread(start_gateways, stack, recalls, gateways, tag)
    results: list[RunResult] = []
    rss: dict[str, float] = {}
    try:
        try:
            async with sessions_on([url for _, url in started], args.sessions_per_gateway) as sessions:
                rng = random.Random(args.seed)  # noqa: S311 - a repeatable call mix, not a secret
                # Warm-up: every session and replica has served a few calls (connections, L1).
                await offered_load(sessions, rates[0], args.warmup, args.remember_share, memories, queries, rng)
                for rate in rates:
                    psutil.cpu_percent(None)
                    began = time.perf_counter()
                    samples = await offered_load(sessions, rate, args.duration, args.remember_share, memories, queries, rng)
                    result = RunResult(f"{recalls} recall x {gateways} gateway", rate, time.perf_counter() - began, samples)
                    result.cpu_percent = psutil.cpu_percent(None)
                    results.append(result)
                rss = process_rss(stack, [proc for proc, _ in started])
        except* anyio.ClosedResourceError:
            # The answer to a call that had already timed out (an error above) arrived while its
            # session closed: nothing is lost but that answer.
            print(f"{tag}: a late answer met a closed session (its call is counted as an error)", flush=True)
    finally:
        for proc, _ in started:
            await asyncio.to_thread(proc.stop)
    return results, rss


def report(results: list[RunResult]) -> None:
    rows = []
    for r in results:
        ok = r.ok()
        rows.append([
            r.config, f"{r.rate:g}", str(len(r.samples)), f"{len(ok) / r.window_s:.1f}",
            *(f"{percentile(r.ok(tool), q):.0f}" for tool in ("recall", "remember") for q in (50, 95)),
            f"{percentile(ok, 99):.0f}", str(len(r.errors)), f"{r.cpu_percent:.0f}",
        ])
    header = ["config", "offered/s", "sent", "answered/s", "recall p50", "recall p95", "remember p50", "remember p95",
              "all p99", "errors", "cpu %"]
    print_table("MCP calls at a fixed offered load (ms, client side, loopback)", header, rows)
    for r in results:
        kinds: dict[str, int] = {}
        for s in r.errors:
            kinds[s.error or "?"] = kinds.get(s.error or "?", 0) + 1
        if kinds:
            print(f"errors in {r.config} at {r.rate:g}/s: {kinds}")


async def run(args: argparse.Namespace) -> int:
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rates = [float(x) for x in args.rates.split(",")]
    memories = generate(args.seed_memories, seed=args.seed)
    queries = [{**q.arguments, "workspace": f"{NAMESPACE}-{memories[q.expected].fragment['workspace']}"}
               for q in text_queries(memories, 200, seed=args.seed)]
    data_dir = Path(tempfile.mkdtemp(prefix="engram-scale-", dir="/tmp"))
    all_results: list[RunResult] = []
    rss_by_config: dict[str, dict[str, float]] = {}
    stack = Stack(stack_config(data_dir / "stack"))
    try:
        # Off the event loop: the stack's start-up runs its own asyncio (migrations).
        await asyncio.to_thread(stack.__enter__)
        print(f"stack up: recall replicas {stack.recall_urls}, ingest {stack.ingest_url}", flush=True)
        await seed_store(stack.gateway_url, memories)
        print(f"stored {len(memories)} corpus memories", flush=True)
        # Rounds alternate the order (ABCD, DCBA, ...): on a machine whose other load drifts,
        # a configuration measured only first or only last would carry that drift as its own.
        for round_no in range(args.rounds):
            for recalls, gateways in configs if round_no % 2 == 0 else configs[::-1]:
                results, rss = await run_config(stack, recalls, gateways, rates, args, memories, queries)
                for result in results:
                    result.config += f" (round {round_no + 1})"
                all_results.extend(results)
                rss_by_config[f"{recalls}x{gateways}"] = rss
                report(results)
    finally:
        await asyncio.to_thread(stack.stop)
        shutil.rmtree(data_dir, ignore_errors=True)
    report(all_results)
    names = sorted({name for rss in rss_by_config.values() for name in rss})
    print_table("RSS after the load (MiB; worker = parent + pool)", ["config", *names],
                [[config, *(f"{rss[n]:.0f}" if n in rss else "-" for n in names)] for config, rss in rss_by_config.items()])
    return 1 if any(r.errors for r in all_results) else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="1x1,2x1,1x2,2x2", help="RECALLSxGATEWAYS, comma-separated")
    parser.add_argument("--rates", default="4,8", help="offered calls per second, comma-separated")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per rate")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--remember-share", type=float, default=0.2)
    parser.add_argument("--sessions-per-gateway", type=int, default=4)
    parser.add_argument("--seed-memories", type=int, default=500)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the configurations, alternating their order")
    args = parser.parse_args(argv)
    print(f"scale bench on {platform.node()}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          "(other work on the machine makes these numbers noisy)", flush=True)
    raise SystemExit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
