"""Fault bench: a `remember` load with idempotency keys from a few concurrent MCP clients on a
private stack, while each of ingest, recall, the gateway, the worker, Redis and Postgres is
killed with SIGKILL in turn and the stack's supervisor restarts it.

    python -m bench.fault_bench [--clients 4] [--max-writes 2000] [--interval 5] [--keep]

Clients retry a failed call with the same idempotency key (bounded attempts, a timeout per
attempt). Afterwards Postgres is asked whether every acknowledged write is stored exactly
once. Printed per killed process: seconds until the supervisor had it serving again, seconds
until the first write started after the kill succeeded, failed attempts, writes lost and
duplicated. Numbers, not assertions; tests/stack/test_supervisor.py runs a small one and
asserts exactly-once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import print_table, private_stack_config
from services.stack.client import mcp_session, payload
from services.stack.restart import Supervised
from services.stack.supervisor import Stack
from shared.db import SEARCH_PATH

# The order issue 15 names them in; the recall replica is the stack's first.
KILL_ORDER = ("ingest", "recall-0", "gateway", "worker", "redis", "postgres")


@dataclass(frozen=True)
class LoadSettings:
    clients: int = 4
    max_writes: int = 2000  # in all; the load also ends soon after the last kill recovered
    call_timeout: float = 20.0  # one attempt (session set-up included); past it, the call hung
    attempts: int = 30  # per write, each after the previous failed
    retry_wait: float = 0.25  # doubled after each failed attempt, up to retry_wait_cap
    retry_wait_cap: float = 2.0
    interval: float = 5.0  # load between the recovery of one kill and the next kill
    recover_timeout: float = 180.0  # a kill not recovered by then is reported as not recovered
    tail_writes: int = 20  # written after the last recovery, so the last kill has successes after it


@dataclass
class Write:
    key: str
    content: str
    first_attempt: float = 0.0
    acked_id: str | None = None
    attempts: int = 0
    failures: list[float] = field(default_factory=list)  # start time of each failed attempt
    hung: int = 0


@dataclass
class Kill:
    name: str
    pid: int
    at: float
    restarted_after: float | None = None  # the supervisor had it serving again
    recovered_after: float | None = None  # first write started after the kill succeeded
    errors: int = 0
    lost: int = 0
    duplicated: int = 0


@dataclass
class FaultReport:
    kills: list[Kill]
    writes: list[Write]
    lost: list[str]  # idempotency keys acknowledged and not stored
    duplicated: dict[str, int]  # idempotency key -> fragments stored for it, where more than one
    mismatched: list[str]  # acknowledged with another fragment id than the one stored for the key
    seconds: float

    @property
    def acknowledged(self) -> int:
        return sum(w.acked_id is not None for w in self.writes)

    @property
    def hung(self) -> int:
        return sum(w.hung for w in self.writes)

    @property
    def given_up(self) -> int:
        return sum(w.acked_id is None for w in self.writes)


class Load:
    """Concurrent clients writing until told to stop. Each attempt opens its own MCP session:
    a session broken by a kill (its task group cancelled under the caller) cannot be reused,
    and the timeout then covers everything one attempt waits for."""

    def __init__(self, stack: Stack, workspace: str, settings: LoadSettings) -> None:
        self.stack = stack
        self.workspace = workspace
        self.settings = settings
        self.writes: list[Write] = []
        self.stopping = asyncio.Event()
        self.acked_at: list[tuple[float, float]] = []  # (attempt started, acknowledged)

    async def client(self, number: int) -> None:
        i = 0
        while not self.stopping.is_set() and len(self.writes) < self.settings.max_writes:
            token = uuid.uuid4().hex[:12]
            write = Write(
                key=f"{self.workspace}-{number}-{i}",
                content=f"Fault bench write {i} of client {number}: deploy marker {token} recorded for the ops log.",
            )
            self.writes.append(write)
            await self._write(write)
            i += 1

    async def _attempt(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        async with mcp_session(self.stack.mcp_url, self.stack.master_key) as session:
            result = await session.call_tool("remember", arguments)
        return None if result.is_error else payload(result)

    async def _write(self, write: Write) -> None:
        arguments = {"content": write.content, "topic": "faults", "type": "fact", "workspace": self.workspace,
                     "idempotencyKey": write.key}
        wait = self.settings.retry_wait
        write.first_attempt = time.monotonic()
        while write.attempts < self.settings.attempts:
            write.attempts += 1
            started = time.monotonic()
            body = None
            try:
                async with asyncio.timeout(self.settings.call_timeout):
                    body = await self._attempt(arguments)
            except TimeoutError:
                write.hung += 1
            # Whatever broke (a reset connection, a JSON-RPC error, an exception group out of
            # the client's task group), the attempt failed and is retried with the same key.
            except Exception:  # noqa: BLE001, S110 - the top of one attempt
                pass
            if body is not None and body.get("success") and body.get("id"):
                write.acked_id = body["id"]
                self.acked_at.append((started, time.monotonic()))
                return
            write.failures.append(started)
            await asyncio.sleep(wait)
            wait = min(self.settings.retry_wait_cap, wait * 2)


def _unit(stack: Stack, name: str) -> Supervised:
    return next(unit for unit in stack.supervised() if unit.name == name)


async def _kill_and_wait(stack: Stack, load: Load, name: str, settings: LoadSettings) -> Kill:
    pid = stack.pids()[name]
    kill = Kill(name, pid, time.monotonic())
    os.kill(pid, signal.SIGKILL)  # the process itself, as `kill -9 <pid>` would
    unit = _unit(stack, name)
    deadline = kill.at + settings.recover_timeout
    while time.monotonic() < deadline and (kill.restarted_after is None or kill.recovered_after is None):
        if kill.restarted_after is None and unit.pid != pid and unit.alive() and await asyncio.to_thread(unit.ready):
            kill.restarted_after = time.monotonic() - kill.at
        if kill.recovered_after is None:
            after = [done for started, done in load.acked_at if started >= kill.at]
            if after:
                kill.recovered_after = min(after) - kill.at
        await asyncio.sleep(0.1)
    return kill


async def run_faults(stack: Stack, settings: LoadSettings, kill_order: tuple[str, ...] = KILL_ORDER) -> FaultReport:
    started = time.monotonic()
    workspace = f"faults-{uuid.uuid4().hex[:8]}"
    load = Load(stack, workspace, settings)
    clients = [asyncio.create_task(load.client(n)) for n in range(settings.clients)]
    kills: list[Kill] = []
    try:
        for name in kill_order:
            await asyncio.sleep(settings.interval)
            kills.append(await _kill_and_wait(stack, load, name, settings))
        target = len(load.writes) + settings.tail_writes
        while len(load.writes) < min(target, settings.max_writes) and not all(c.done() for c in clients):
            await asyncio.sleep(0.1)
    finally:
        load.stopping.set()
        await asyncio.gather(*clients)
    report = await verify(stack.database_url, load.writes, kills)
    report.seconds = time.monotonic() - started
    return report


async def verify(database_url: str, writes: list[Write], kills: list[Kill]) -> FaultReport:
    """Asks Postgres, not the clients: one idempotency record and one fragment per
    acknowledged write, the fragment the acknowledgement named."""
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        records = {r["idempotency_key"]: r["fragment_id"] for r in await conn.fetch(
            "SELECT idempotency_key, fragment_id FROM idempotency_records WHERE idempotency_key = ANY($1::text[])",
            [w.key for w in writes],
        )}
        stored = {r["content"]: r["n"] for r in await conn.fetch(
            "SELECT content, count(*) AS n FROM fragments WHERE content = ANY($1::text[]) GROUP BY content",
            [w.content for w in writes],
        )}
    finally:
        await conn.close()
    lost, mismatched, duplicated = [], [], {}
    for w in writes:
        copies = stored.get(w.content, 0)
        if copies > 1:
            duplicated[w.key] = copies
        if w.acked_id is None:
            continue
        if copies == 0 or w.key not in records:
            lost.append(w.key)
        elif records[w.key] != w.acked_id:
            mismatched.append(w.key)
    for w in writes:
        kill = _window(kills, w)
        if kill is not None:
            kill.lost += w.key in lost
            kill.duplicated += w.key in duplicated
    for kill, following in zip(kills, [*kills[1:], None], strict=True):
        end = following.at if following else float("inf")
        kill.errors = sum(kill.at <= t < end for w in writes for t in w.failures)
    return FaultReport(kills, writes, lost, duplicated, mismatched, 0.0)


def _window(kills: list[Kill], write: Write) -> Kill | None:
    """The kill a write's trouble belongs to: the last one before its first failed attempt
    (or before it started, if none failed)."""
    moment = write.failures[0] if write.failures else write.first_attempt
    before = [k for k in kills if k.at <= moment]
    return before[-1] if before else None


def print_report(report: FaultReport) -> None:
    def seconds(value: float | None) -> str:
        return "not recovered" if value is None else f"{value:.1f}"

    print_table(
        "kill -9 under a remember load (idempotency keys, retried with the same key)",
        ["killed", "restarted after s", "first write ok after s", "failed attempts", "lost", "duplicated"],
        [[k.name, seconds(k.restarted_after), seconds(k.recovered_after), str(k.errors), str(k.lost), str(k.duplicated)]
         for k in report.kills],
    )
    print(f"{len(report.writes)} writes in {report.seconds:.0f} s: {report.acknowledged} acknowledged, "
          f"{report.given_up} given up; lost {len(report.lost)}, duplicated {len(report.duplicated)}, "
          f"acknowledged with another id {len(report.mismatched)}, attempts past their timeout (hung) {report.hung}",
          flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = LoadSettings()
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--max-writes", type=int, default=defaults.max_writes)
    parser.add_argument("--interval", type=float, default=defaults.interval, help="seconds of load between kills")
    parser.add_argument("--call-timeout", type=float, default=defaults.call_timeout)
    parser.add_argument("--keep", action="store_true", help="keep the private stack's temp dir (logs)")
    args = parser.parse_args(argv)
    # The client warns on every session it cannot close during an outage; the table counts them.
    logging.getLogger("mcp.client.streamable_http").setLevel(logging.ERROR)
    settings = LoadSettings(clients=args.clients, max_writes=args.max_writes, interval=args.interval,
                            call_timeout=args.call_timeout)
    # Under /tmp: embedded Postgres makes its data dir's parents world-readable.
    data_dir = Path(tempfile.mkdtemp(prefix="engram-faults-", dir="/tmp"))
    try:
        with Stack(private_stack_config(data_dir / "stack")) as stack:
            print(f"private stack up at {stack.mcp_url}; restarts logged in {stack.supervisor_log}", flush=True)
            report = asyncio.run(run_faults(stack, settings))
            print_report(report)
            print(stack.supervisor_log.read_text(), flush=True)
    finally:
        if args.keep:
            print(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
