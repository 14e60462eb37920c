"""Where a benchmark runs: a stack the caller names (--url/--key) or a private one.

Everything a benchmark measures goes through the gateway's MCP endpoint with the `mcp`
SDK client and the master key, as an agent would see it.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import ClientSession

from services.stack import client
from services.stack.supervisor import Stack, StackConfig, free_port

logger = logging.getLogger("engram.bench")


@dataclass(frozen=True)
class Target:
    mcp_url: str
    key: str


class ToolFailed(RuntimeError):
    """A tool call answered isError; benchmarks stop rather than time failures."""


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="MCP endpoint of a running stack, e.g. http://127.0.0.1:57332/mcp")
    parser.add_argument("--key", help="master key of that stack (required with --url)")
    parser.add_argument("--keep", action="store_true", help="keep the private stack's temp dir (logs)")


def private_stack_config(data_dir: Path) -> StackConfig:
    # Free ports, so a benchmark can run beside `make run` and the test suite.
    return StackConfig(
        data_dir=data_dir,
        gateway_port=free_port(),
        recall_ports=[free_port()],
        ingest_port=free_port(),
        pg_port=free_port(),
        redis_port=free_port(),
        master_key="bench-master-key",
        extra_env={"ENGRAM_ENV": "test", "LOG_LEVEL": "WARNING"},
    )


@contextmanager
def private_stack(keep: bool = False) -> Iterator[Target]:
    # Under /tmp: embedded Postgres makes its data dir's parents world-readable.
    data_dir = Path(tempfile.mkdtemp(prefix="engram-bench-", dir="/tmp"))
    started = time.perf_counter()
    try:
        with Stack(private_stack_config(data_dir / "stack")) as stack:
            print(f"private stack up in {time.perf_counter() - started:.1f} s at {stack.mcp_url} (data {data_dir})", flush=True)
            yield Target(stack.mcp_url, stack.master_key)
    finally:
        if keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def target_from(args: argparse.Namespace) -> Iterator[Target]:
    if args.url:
        if not args.key:
            raise SystemExit("--url needs --key")
        yield Target(args.url, args.key)
        return
    with private_stack(keep=args.keep) as target:
        yield target


@asynccontextmanager
async def mcp_session(target: Target) -> AsyncIterator[ClientSession]:
    async with client.mcp_session(target.mcp_url, target.key, timeout=300) as session:
        yield session


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    if getattr(result, "is_error", False):
        text = result.content[0].text if result.content else ""
        raise ToolFailed(f"{tool} failed: {text[:300]}")
    return client.payload(result)


async def timed_call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Client-side latency of one call_tool, in milliseconds, and its result."""
    started = time.perf_counter()
    body = await call(session, tool, arguments)
    return (time.perf_counter() - started) * 1000, body


# -- reporting ---------------------------------------------------------------------------

def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    # Nearest rank, so p99 of 300 samples is a sample that was actually observed.
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_row(name: str, samples_ms: Sequence[float], extra: str = "") -> list[str]:
    return [
        name, str(len(samples_ms)),
        f"{percentile(samples_ms, 50):.1f}", f"{percentile(samples_ms, 95):.1f}", f"{percentile(samples_ms, 99):.1f}",
        f"{statistics.fmean(samples_ms):.1f}" if samples_ms else "nan", f"{max(samples_ms):.1f}" if samples_ms else "nan",
        extra,
    ]


LATENCY_HEADER = ["case", "n", "p50 ms", "p95 ms", "p99 ms", "mean ms", "max ms", "notes"]


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    print(line)
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    print(flush=True)
