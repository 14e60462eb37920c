"""The supervisor behind `make run` and the tests restarts what dies, with backoff: each of
ingest, recall, the gateway, the worker, Redis and Postgres is killed with SIGKILL in turn on
one private stack, and the stack serves again without anyone starting anything."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench.fault_bench import KILL_ORDER, LoadSettings, print_report, run_faults
from services.stack.restart import Backoff, Watchdog
from services.stack.supervisor import ServiceProcess
from tests.support import Stack, call, mcp_session, new_stack_config, unique

# Generous: on two shared cores a service takes a few seconds to load its model again.
RECOVERY_SECONDS = 180


class Deaths(logging.Handler):
    """The watchdog's warnings: one per death, with the wait before the restart."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [Backoff(initial=1, cap=30).delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_crash_loop_backs_off_and_a_deliberate_stop_is_not_undone(tmp_path: Path) -> None:
    crashing = ServiceProcess("crasher", [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), tmp_path / "crasher.log")
    log = logging.getLogger(f"test.watchdog.{tmp_path.name}")
    lines = Deaths()
    log.addHandler(lines)
    watchdog = Watchdog(crashing, Backoff(initial=0.1, cap=0.4, stable_after=60), log)
    crashing.start()
    watchdog.start()
    try:
        deadline = time.monotonic() + 60
        while len(lines.lines) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        deaths = list(lines.lines)
        assert len(deaths) >= 5, deaths
        assert all("crasher" in line and "exited with code 3" in line for line in deaths), deaths
        # No restart storm: each failure in a row waits twice as long, up to the cap.
        waits = [float(re.search(r"in ([0-9.]+) s", line).group(1)) for line in deaths[:5]]  # type: ignore[union-attr]
        assert waits == [0.1, 0.2, 0.4, 0.4, 0.4]

        crashing.stop()
        seen = len(lines.lines)
        time.sleep(1.0)  # more than two capped waits: a restart would have come by now
        assert len(lines.lines) <= seen + 1, lines.lines[seen:]  # at most the death it was in the middle of
        assert not crashing.alive()
    finally:
        watchdog.stop()
        watchdog.join()
        log.removeHandler(lines)


@pytest.fixture(scope="module")
def supervised(stack_dir: Path) -> Iterator[Stack]:
    # Its own Redis and Postgres (never a REDIS_URL from outside): both are killed here. No
    # beat: nothing here needs its schedule, and the two cores are shared.
    config = new_stack_config(stack_dir / "supervised", redis_url=None, database_url=None, beat=False,
                              master_key="supervised-master-key")
    with Stack(config) as own:
        yield own


async def _remember_and_recall(stack: Stack) -> str | None:
    """None when a fresh fragment is stored and found again through the gateway, else what
    went wrong."""
    token = f"probe{unique('')[1:]}"
    ws = unique("sup")
    try:
        async with asyncio.timeout(30), mcp_session(stack.mcp_url, stack.master_key) as s:
            stored = await call(s, "remember", {"content": f"The {token} canary deploy passed its smoke tests.",
                                                "topic": "deploys", "type": "fact", "workspace": ws})
            found = await call(s, "recall", {"keywords": [token], "workspace": ws})
    # Anything going wrong during the outage is one failed probe; only recovery is asserted.
    except Exception as error:  # noqa: BLE001
        return repr(error)
    if stored.get("id") not in {f["id"] for f in found.get("fragments", [])}:
        return f"stored {stored} but recall found {found}"
    return None


async def _serves_again(stack: Stack) -> str | None:
    """None once a probe succeeds within RECOVERY_SECONDS, else the last probe's failure."""
    deadline = time.monotonic() + RECOVERY_SECONDS
    failure = await _remember_and_recall(stack)
    while failure is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        failure = await _remember_and_recall(stack)
    return failure


async def _logged(stack: Stack, pattern: str) -> bool:
    deadline = time.monotonic() + RECOVERY_SECONDS
    while time.monotonic() < deadline:
        if re.search(pattern, stack.supervisor_log.read_text()):
            return True
        await asyncio.sleep(0.2)
    return False


def _tails(stack: Stack, lines: int = 30) -> str:
    """The end of every service's own log: why a restarted process failed to start, for the
    assertion message (CI removes the stack's directory)."""
    parts = []
    for path in sorted(stack.log_dir.glob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)


async def test_each_killed_process_comes_back_by_itself(supervised: Stack) -> None:
    assert await _remember_and_recall(supervised) is None
    for name in KILL_ORDER:
        pid = supervised.pids()[name]
        os.kill(pid, signal.SIGKILL)
        failure = await _serves_again(supervised)
        assert failure is None, f"no remember + recall within {RECOVERY_SECONDS} s of killing {name}: {failure}\n{_tails(supervised)}"
        assert await _logged(supervised, rf"{name} \(pid {pid}\) killed by SIGKILL"), supervised.supervisor_log.read_text()
        assert await _logged(supervised, rf"{name} is back \(pid (?!{pid}\))\d+\)"), supervised.supervisor_log.read_text()
        assert supervised.pids()[name] != pid


async def test_writes_under_kills_are_stored_exactly_once(supervised: Stack) -> None:
    """The fault bench, small: two clients write with idempotency keys and retry with the same
    key while each process is killed once; Postgres holds every acknowledged write once."""
    # max_writes only bounds a runaway: the load ends a few writes after the last kill recovered.
    settings = LoadSettings(clients=2, max_writes=2000, interval=1.0, tail_writes=6, call_timeout=60,
                            recover_timeout=RECOVERY_SECONDS)
    report = await run_faults(supervised, settings)
    print_report(report)
    assert [k.name for k in report.kills if k.restarted_after is None] == [], _tails(supervised)
    assert [k.name for k in report.kills if k.recovered_after is None] == [], _tails(supervised)
    assert report.acknowledged > 0
    assert report.lost == [] and report.duplicated == {} and report.mismatched == []
    assert report.hung == 0, "an attempt outlived its timeout"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_stop_stops_everything_and_restarts_nothing(supervised: Stack) -> None:
    pids = supervised.pids()
    ingest_pid = pids["ingest"]
    os.kill(ingest_pid, signal.SIGKILL)
    # Stop while ingest's watchdog waits out its backoff: the restart must not come.
    assert await _logged(supervised, rf"ingest \(pid {ingest_pid}\) killed by SIGKILL")
    await asyncio.to_thread(supervised.stop)
    wait = re.search(rf"ingest \(pid {ingest_pid}\) killed by SIGKILL; restarting in ([0-9.]+) s", supervised.supervisor_log.read_text())
    assert wait is not None
    await asyncio.sleep(float(wait.group(1)) + 2)  # past the backoff the restart was waiting for
    assert [pid for pid in pids.values() if _running(pid)] == []
    config = supervised.config
    ports = [config.gateway_port, config.ingest_port, *config.recall_ports, config.pg_port, config.redis_port]
    assert [p for p in ports if _listening(p)] == []
    log = supervised.supervisor_log.read_text()
    assert "ingest is back" not in log.split(f"ingest (pid {ingest_pid}) killed")[-1]
    assert log.rstrip().endswith("stopping")
