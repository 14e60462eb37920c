"""Loading a corpus with batch_remember from several concurrent MCP clients."""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.corpus import Memory
from bench.harness import Target, call, mcp_session

# seed: batch_remember takes at most 200 fragments per call.
BATCH = 200
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# What a process of a stack is, by its command line (first match wins).
_PROCESS_KINDS = (
    ("services.ingest", "ingest"), ("services.gateway", "gateway"), ("services.recall", "recall"),
    (" worker", "worker"), (" beat", "beat"), ("redis-server", "redis"), ("postgres", "postgres"),
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process and its threads (not its reaped children's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _proc_table() -> tuple[dict[int, int], dict[int, float], dict[int, str]]:
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    cmdline: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent[pid] = int(fields[1])
        # Its own user and system time, and its reaped children's: a Postgres backend or
        # autovacuum worker that exits between two readings is gone from /proc, and its CPU is
        # then in the postmaster's cutime / cstime (counted once: a live child is not in them).
        cpu[pid] = sum(int(ticks) for ticks in fields[11:15]) / _TICKS
    return parent, cpu, cmdline


def _url_port(url: str) -> str | None:
    match = re.search(r":(\d+)/", url)
    return match.group(1) if match else None


def _database_port(pids: list[int]) -> str | None:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        port = _url_port(env.get(b"DATABASE_URL", b"").decode())
        if port:
            return port
    return None


def _postmasters(cmdline: dict[int, str], port: str | None) -> list[int]:
    """The Postgres server listening on `port`, by its command line (`-p PORT`, or embedded
    Postgres' `-c port=PORT`)."""
    if not port:
        return []
    return [pid for pid, cmd in cmdline.items()
            if "postgres" in cmd and (f" -p {port} " in f"{cmd} " or f" port={port} " in f"{cmd} ")]


def stack_processes(database_url: str | None = None) -> tuple[dict[int, float], dict[int, str], set[int]] | None:
    """A private stack's live processes: every process below this one (services, worker) plus
    its Postgres (pg_ctl detaches the postmaster; found by the port in the services'
    DATABASE_URL) and the postmaster's backends, as (CPU seconds by pid, command line by pid,
    the stack's pids). With `database_url`, the stack of the Postgres on that URL's port that
    another process serves (`growth_bench --serve`, `services.stack run`): every process below
    the postmaster's parent. None where /proc is missing or no stack is found."""
    try:
        parent, cpu, cmdline = _proc_table()
    except OSError:
        return None

    def below(root: int) -> list[int]:
        out = []
        for pid in cpu:
            ancestor = parent.get(pid)
            while ancestor and ancestor != root:
                ancestor = parent.get(ancestor)
            if ancestor == root:
                out.append(pid)
        return out

    if database_url is not None:
        postgres = _postmasters(cmdline, _url_port(database_url))
        roots = {parent.get(pid, 0) for pid in postgres} - {0, 1}
        mine = [pid for root in roots for pid in below(root) if pid != os.getpid()]
    else:
        mine = below(os.getpid())
        postgres = _postmasters(cmdline, _database_port(mine))
    if not mine:
        return None
    return cpu, cmdline, set(mine) | set(postgres) | {pid for root in postgres for pid in below(root)}


def stack_cpu_by_process(database_url: str | None = None) -> dict[str, float]:
    """CPU seconds so far of a stack's processes (stack_processes), summed by what they are;
    {} where they cannot be found."""
    found = stack_processes(database_url)
    if found is None:
        return {}
    cpu, cmdline, counted = found
    out: dict[str, float] = {}
    for pid in counted:
        kind = next((name for marker, name in _PROCESS_KINDS if marker in cmdline[pid]), "other")
        out[kind] = out.get(kind, 0.0) + cpu[pid]
    return out


def descendants_cpu_seconds() -> float | None:
    """CPU seconds (user + system) used so far by a private stack (stack_processes). On a
    machine shared with other work, wall-clock rates swing with its load; the CPU a run costs
    does not. None where the stack's processes cannot be found."""
    found = stack_processes()
    if found is None:
        return None
    cpu, _, counted = found
    return sum(cpu[pid] for pid in counted)


def run_namespace(label: str) -> str:
    """A workspace prefix unique to one run, so reruns against a shared stack neither
    collide with earlier data nor get deduplicated (content_hash is per workspace)."""
    return f"bench-{label}-{uuid.uuid4().hex[:6]}"


def scoped(fragment: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**fragment, "workspace": f"{namespace}-{fragment['workspace']}"}


@dataclass
class LoadResult:
    ids: list[str | None]
    seconds: float
    batch_ms: list[float] = field(default_factory=list)
    failed: int = 0
    duplicates: int = 0
    # CPU seconds the stack spent meanwhile (descendants_cpu_seconds), None when unknown.
    stack_cpu: float | None = None

    @property
    def stored(self) -> int:
        return sum(1 for i in self.ids if i) - self.duplicates

    @property
    def rate(self) -> float:
        return len(self.ids) / self.seconds if self.seconds else float("nan")

    @property
    def per_cpu_second(self) -> float | None:
        return len(self.ids) / self.stack_cpu if self.stack_cpu else None


async def load(target: Target, memories: list[Memory], namespace: str, clients: int, batch: int = BATCH) -> LoadResult:
    """Store every memory; ids[i] answers memories[i]. Clients pull the next batch from a
    shared cursor, so a slow batch does not idle the others."""
    fragments = [scoped(m.fragment, namespace) for m in memories]
    batches = [(start, fragments[start:start + batch]) for start in range(0, len(fragments), batch)]
    result = LoadResult(ids=[None] * len(fragments), seconds=0.0)
    cursor = iter(batches)

    async def client() -> None:
        async with mcp_session(target) as session:
            for start, items in cursor:
                began = time.perf_counter()
                body = await call(session, "batch_remember", {"fragments": items})
                result.batch_ms.append((time.perf_counter() - began) * 1000)
                for item in body["results"]:
                    if item.get("success"):
                        result.ids[start + item["index"]] = item["id"]
                        result.duplicates += bool(item.get("duplicate"))
                    else:
                        result.failed += 1

    cpu_before = descendants_cpu_seconds()
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    result.seconds = time.perf_counter() - began
    cpu_after = descendants_cpu_seconds()
    if cpu_before is not None and cpu_after is not None:
        result.stack_cpu = cpu_after - cpu_before
    return result
