"""The gateway's own cost per tool call: the same cheap call end to end through MCP and
straight to the internal service it is forwarded to.

    python -m bench.gateway_bench [--calls 300] [--keep]

Cases, each timed client-side over `--calls` sequential calls after a warm-up:

- *direct*: `POST {recall}/v1/tools/memory_stats` with the service token on a keep-alive
  connection, what the gateway itself does per forwarded call;
- *mcp api key*: `memory_stats` through MCP with an API key that has a `daily_limit` and a
  `fragment_limit` (so every per-call cost of the gateway is paid: key lookup, the daily
  counter, RBAC, session activity, the X-RateLimit-* usage, the forward);
- *mcp master*: the same with the master key (unmetered, no limits);
- *mcp gateway-only*: `get_skill_guide` with the API key, answered by the gateway itself
  (no forward: MCP framing plus the gateway's per-call work).

"overhead" is mcp api key p50/p95 minus direct p50/p95. Latency is noisy on a shared 2-core
machine, so each case also reports the CPU time the gateway process (resp. the recall
process, for *direct*) spent per call, read from /proc before and after the case. That number
still moves with the machine (the same code measured 3.0-5.7 ms minutes apart), so

    python -m bench.gateway_bench --callgrind [--calls 200]

counts instructions instead: a second gateway of the same stack runs under valgrind's
callgrind (same environment, its own port), and per MCP case the counters are zeroed after the
warm-up and dumped after the calls (callgrind_control). Instructions per call do not depend on
the machine's load or speed (runs of the same code agree within ~3%), so two commits compare
at any time: copy this file into a worktree of the other commit and run it there. The stack is
private (free ports, temp dir), started and stopped by the script.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import LATENCY_HEADER, free_port, latency_row, percentile, print_table, private_stack_config
from bench.loading import cpu_seconds
from services.common.internal import SERVICE_TOKEN_HEADER
from services.stack import client
from shared.domain.principal import Principal

WARMUP = 30

class CpuMeter:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started = 0.0

    def start(self) -> None:
        self.started = cpu_seconds(self.pid)

    def per_call_ms(self, calls: int) -> float:
        return (cpu_seconds(self.pid) - self.started) * 1000 / calls


async def time_direct(recall_url: str, service_token: str, calls: int, cpu: CpuMeter) -> list[float]:
    payload = {"arguments": {}, "principal": Principal.master().to_wire(), "session": None}
    samples: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for i in range(WARMUP + calls):
            if i == WARMUP:
                cpu.start()
            started = time.perf_counter()
            response = await http.post(f"{recall_url}/v1/tools/memory_stats", json=payload, headers={SERVICE_TOKEN_HEADER: service_token})
            elapsed = (time.perf_counter() - started) * 1000
            response.raise_for_status()
            if i >= WARMUP:
                samples.append(elapsed)
    return samples


async def time_mcp(mcp_url: str, key: str, tool: str, arguments: dict, calls: int, cpu: CpuMeter) -> list[float]:
    samples: list[float] = []
    async with client.mcp_session(mcp_url, key, timeout=60) as session:
        for i in range(WARMUP + calls):
            if i == WARMUP:
                cpu.start()
            started = time.perf_counter()
            result = await session.call_tool(tool, arguments)
            elapsed = (time.perf_counter() - started) * 1000
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content[0].text[:200] if result.content else ''}")
            if i >= WARMUP:
                samples.append(elapsed)
    return samples


async def create_key(gateway_url: str, master_key: str) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{gateway_url}/v1/internal/model/nothing/keys",
            headers={"Authorization": f"Bearer {master_key}"},
            json={"name": f"bench-gateway-{int(time.time())}", "daily_limit": 1_000_000, "fragment_limit": 1_000_000},
        )
        response.raise_for_status()
        return response.json()["raw_key"]


async def run(recall_url: str, service_token: str, gateway_url: str, master_key: str, calls: int, gateway_pid: int, recall_pid: int) -> None:
    mcp_url = f"{gateway_url}/mcp"
    key = await create_key(gateway_url, master_key)
    gateway_cpu, recall_cpu = CpuMeter(gateway_pid), CpuMeter(recall_pid)
    rows = []
    direct = await time_direct(recall_url, service_token, calls, recall_cpu)
    rows.append(latency_row("direct recall /v1/tools/memory_stats", direct, f"recall CPU {recall_cpu.per_call_ms(calls):.2f} ms/call"))
    cases = [
        ("mcp memory_stats, api key (limits)", key, "memory_stats", {}),
        ("mcp memory_stats, master key", master_key, "memory_stats", {}),
        ("mcp get_skill_guide, api key (no forward)", key, "get_skill_guide", {"section": "keywords"}),
    ]
    timed: dict[str, list[float]] = {}
    for name, credential, tool, arguments in cases:
        samples = await time_mcp(mcp_url, credential, tool, arguments, calls, gateway_cpu)
        timed[name] = samples
        rows.append(latency_row(name, samples, f"gateway CPU {gateway_cpu.per_call_ms(calls):.2f} ms/call"))
    print_table(f"gateway per-call cost, {calls} sequential calls per case after {WARMUP} warm-up", LATENCY_HEADER, rows)
    keyed = timed[cases[0][0]]
    print(
        f"gateway overhead (mcp api key - direct): p50 {percentile(keyed, 50) - percentile(direct, 50):.1f} ms, "
        f"p95 {percentile(keyed, 95) - percentile(direct, 95):.1f} ms",
        flush=True,
    )


class Callgrind:
    """The stack's gateway once more, under callgrind: instructions per call, load-insensitive."""

    def __init__(self, stack: Any, out_dir: Path) -> None:
        planned = next(p for p in stack.plan() if p.name == "gateway")
        self.port = free_port()
        argv = list(planned.argv)
        argv[argv.index("--port") + 1] = str(self.port)
        # Everything runs ~30x slower under valgrind: no Redis or upstream timeout may fire.
        env = dict(planned.env) | {"PORT": str(self.port), "REDIS_TIMEOUT": "PT10S", "UPSTREAM_TIMEOUT": "PT300S"}
        self.out_dir = out_dir
        self.log = (out_dir / "gateway-callgrind.log").open("w")
        self.process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_dir}/callgrind.out.%p", *argv],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/health", timeout=30).status_code == 200:
                    self._control("-i", "on")  # instrumentation from here on (startup ran uninstrumented)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"the gateway under valgrind did not start (log: {self.log.name})")

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.process.pid)], check=True, capture_output=True, timeout=300)

    def zero(self) -> None:
        self._control("-z")

    def instructions(self) -> int:
        """Dump the counters and read the instructions executed since the last zero."""
        before = set(glob.glob(f"{self.out_dir}/callgrind.out.*"))
        self._control("-d")
        dumped = max(set(glob.glob(f"{self.out_dir}/callgrind.out.*")) - before, key=os.path.getmtime)
        for line in Path(dumped).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dumped}")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(60)
        self.log.close()


async def count_mcp(grind: Callgrind, key: str, tool: str, arguments: dict, calls: int) -> float:
    """Instructions the gateway executed per call of `tool`, after a warm-up."""
    async with client.mcp_session(f"{grind.url}/mcp", key, timeout=300) as session:
        for i in range(WARMUP + calls):
            if i == WARMUP:
                await asyncio.to_thread(grind.zero)
            result = await session.call_tool(tool, arguments)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content[0].text[:200] if result.content else ''}")
    return await asyncio.to_thread(grind.instructions) / calls


async def run_callgrind(stack: Any, grind: Callgrind, calls: int) -> None:
    key = await create_key(stack.gateway_url, stack.master_key)
    cases = [
        ("mcp memory_stats, api key (limits)", key, "memory_stats", {}),
        ("mcp memory_stats, master key", stack.master_key, "memory_stats", {}),
        ("mcp get_skill_guide, api key (no forward)", key, "get_skill_guide", {"section": "keywords"}),
    ]
    print(f"gateway instructions per call (callgrind), {calls} calls per case after {WARMUP} warm-up", flush=True)
    for name, credential, tool, arguments in cases:
        per_call = await count_mcp(grind, credential, tool, arguments, calls)
        print(f"  {name:45s} {per_call / 1e6:7.3f} M instructions/call", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the private stack's temp dir (logs)")
    parser.add_argument("--redis", choices=["on", "off"], default="on", help="run the stack with REDIS_ENABLED")
    parser.add_argument("--callgrind", action="store_true", help="count the gateway's instructions per call under valgrind")
    args = parser.parse_args()

    import shutil
    import tempfile
    from pathlib import Path

    from services.stack.supervisor import Stack

    data_dir = Path(tempfile.mkdtemp(prefix="engram-bench-", dir="/tmp"))
    config = private_stack_config(data_dir / "stack")
    # No worker or beat: their jobs would compete for the 2 cores with what is timed.
    config.worker = False
    config.beat = False
    # Two api-key cases of --calls each share one key's per-minute limit (1200 by default).
    config.extra_env["RATE_LIMIT_PER_KEY_PER_MIN"] = "100000000"
    config.redis_enabled = args.redis == "on"
    stack = Stack(config)
    try:
        stack.start()
        print(f"private stack up at {stack.mcp_url} (redis {args.redis}, data {data_dir})", flush=True)
        if args.callgrind:
            grind = Callgrind(stack, data_dir)
            try:
                grind.wait_ready()
                asyncio.run(run_callgrind(stack, grind, args.calls))
            finally:
                grind.stop()
            return
        pids = {name: proc.process.pid for name, proc in stack.processes.items() if proc.process is not None}
        asyncio.run(run(stack.recall_urls[0], stack.service_token, stack.gateway_url, stack.master_key, args.calls,
                        pids["gateway"], pids["recall-0"]))
    finally:
        stack.stop()
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
