"""Writes per second with Redis up, hung and down (issue 15: Redis trouble must cost a write
at most a few ms).

    python -m bench.redis_fault_bench [--writes 40] [--clients 4] [--keep]

A private stack reaches its Redis through services/stack/redis_switch.py: "hung" accepts
connections and answers nothing (connect and read timeouts bite), "down" drops every
connection (as a stopped Redis). Each mode stores --writes remembers from --clients
concurrent callers, once straight on ingest's internal API (the write path alone) and once
over MCP through the gateway (what an agent sees; the gateway's own use of Redis counts
there). After the faults it prints how long the job outbox took to drain once Redis was up.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.harness import Target, mcp_session, print_table, private_stack_config
from services.stack.redis_server import LocalRedis
from services.stack.redis_switch import Mode, RedisSwitch
from services.stack.supervisor import Stack, free_port
from shared.db import SEARCH_PATH
from shared.domain.principal import Principal

MODES: tuple[Mode, ...] = ("up", "hung", "down", "up")
DRAIN_WAIT_S = 120


def _content(mode: str, run: int, i: int) -> dict[str, Any]:
    return {"content": f"Bench note {run}-{mode}-{i}: shard {i} of the fault drill holds {i * 7 % 97} objects.",
            "topic": "fault-bench", "type": "fact", "workspace": "redis-fault-bench"}


async def ingest_writes(stack: Stack, mode: str, run: int, writes: int, clients: int) -> list[float]:
    principal = Principal.master().to_wire()
    headers = {"x-engram-service-token": stack.service_token}
    samples: list[float] = []
    async with httpx.AsyncClient(timeout=120) as http:
        async def worker(offset: int) -> None:
            for i in range(offset, writes, clients):
                began = time.perf_counter()
                response = await http.post(f"{stack.ingest_url}/v1/tools/remember", headers=headers, json={
                    "arguments": _content(mode, run, i), "principal": principal, "session": None})
                body = response.json()
                if response.status_code != 200 or body.get("isError") or not body["result"].get("success"):
                    raise RuntimeError(f"remember failed with Redis {mode}: {response.status_code} {body}")
                samples.append(time.perf_counter() - began)

        await asyncio.gather(*(worker(c) for c in range(clients)))
    return samples


async def mcp_writes(stack: Stack, mode: str, run: int, writes: int, clients: int) -> list[float]:
    target = Target(stack.mcp_url, stack.master_key)
    samples: list[float] = []

    async def worker(offset: int) -> None:
        async with mcp_session(target) as session:
            for i in range(offset, writes, clients):
                began = time.perf_counter()
                result = await session.call_tool("remember", _content(f"mcp-{mode}", run, i))
                if result.is_error:
                    raise RuntimeError(f"remember over MCP failed with Redis {mode}: {result.content}")
                samples.append(time.perf_counter() - began)

    await asyncio.gather(*(worker(c) for c in range(clients)))
    return samples


def row(path: str, mode: str, samples: list[float], wall: float) -> list[str]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return [path, mode, str(len(samples)), f"{len(samples) / wall:.1f}", f"{1000 * statistics.median(samples):.0f}",
            f"{1000 * p95:.0f}", f"{1000 * max(samples):.0f}"]


async def outbox_drain_seconds(database_url: str) -> float | None:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        began = time.perf_counter()
        while time.perf_counter() - began < DRAIN_WAIT_S:
            if not await conn.fetchval("SELECT count(*) FROM job_outbox"):
                return time.perf_counter() - began
            await asyncio.sleep(0.1)
        return None
    finally:
        await conn.close()


async def measure(stack: Stack, switch: RedisSwitch, writes: int, clients: int, mcp: bool) -> None:
    rows: list[list[str]] = []
    for run, mode in enumerate(MODES):
        switch.set(mode)
        paths = [("ingest", ingest_writes)] + ([("mcp", mcp_writes)] if mcp else [])
        for path, write in paths:
            began = time.perf_counter()
            try:
                samples = await write(stack, mode, run, writes, clients)
            except RuntimeError as exc:
                rows.append([path, mode, "failed", str(exc)[:60], "", "", ""])
                continue
            rows.append(row(path, mode, samples, time.perf_counter() - began))
        if mode == "up" and run > 0:
            drained = await outbox_drain_seconds(stack.database_url)
            print(f"job outbox empty {drained:.1f} s after Redis came back" if drained is not None  # noqa: T201
                  else "job outbox still not empty after 120 s")
    print_table(f"remember with Redis up / hung / down ({clients} clients)",
                ["path", "redis", "writes", "writes/s", "p50 ms", "p95 ms", "max ms"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=40)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--no-mcp", action="store_true", help="only ingest's internal API")
    parser.add_argument("--keep", action="store_true", help="keep the private stack's temp dir (logs)")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="engram-redis-fault-bench-", dir="/tmp"))
    redis = LocalRedis(data_dir / "redis", free_port())
    redis.start()
    switch = RedisSwitch(redis.port)
    switch.start()
    config = private_stack_config(data_dir / "stack")
    config.redis_url = switch.url
    config.beat = False  # the ingest relay alone drains the outbox
    try:
        with Stack(config) as stack:
            asyncio.run(measure(stack, switch, args.writes, args.clients, not args.no_mcp))
    finally:
        switch.stop()
        redis.stop()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
