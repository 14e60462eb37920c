"""Restarting what dies: one watchdog thread per supervised process, with backoff.

The policy is the one systemd (`Restart=on-failure`, `RestartSec`) and Kubernetes
(CrashLoopBackOff) apply: the first restart comes quickly, each further failure doubles the
wait up to a cap, and a process that stayed up for a while is forgiven its earlier failures.
A process stopped on purpose (its `stop()`) is not restarted; neither is anything once the
stack is shutting down.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import psutil

# How often a watchdog looks at its process: a death is noticed within this, and a stop
# request is honoured within it.
POLL_SECONDS = 0.2


class Supervised(Protocol):
    """A process the stack can restart: a service, the worker, Redis or Postgres."""

    name: str

    @property
    def wanted(self) -> bool:
        """False once stopped on purpose: the watchdog leaves it down."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def alive(self) -> bool: ...

    def respawn(self) -> bool:
        """Clear what the dead process left behind and start it again without waiting for it
        to serve. False when it was stopped on purpose meanwhile (nothing started)."""

    def ready(self) -> bool:
        """Whether it serves again (answers its health check, ping or pg_isready)."""


class ChildProcess:
    """What every supervised process answers about its running child: pid, exit code, alive."""

    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class RestartFailed(RuntimeError):
    """Starting a process again failed; the watchdog counts it as one more failure."""


@dataclass(frozen=True)
class Backoff:
    # systemd restarts after 100 ms and Kubernetes after 10 s; one second lets a port or a
    # lock file be released without making a killed service wait long.
    initial: float = 1.0
    # Kubernetes caps at 5 min; a dev stack someone is watching should retry within 30 s.
    cap: float = 30.0
    # Up this long, a process's earlier failures are forgotten (Kubernetes: 10 min).
    stable_after: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait before the restart that follows `failures` earlier consecutive ones."""
        return min(self.cap, self.initial * 2 ** min(failures, 30))


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exited (status unknown)"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _live_members(pgid: int) -> list[int]:
    """Processes of a group that still run (an orphaned zombie holds nothing, and whether
    anyone reaps it is up to PID 1)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def kill_group(pgid: int, timeout: float = 10) -> None:
    """SIGKILL what is left of a dead process's group and wait until none of it runs: a
    killed postmaster's backends still hold its shared memory, and a new postmaster refuses
    to start beside them ("pre-existing shared memory block is still in use")."""
    deadline = time.monotonic() + timeout
    while members := _live_members(pgid):
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if time.monotonic() > deadline:
            raise RestartFailed(f"processes {members} of group {pgid} survive SIGKILL")
        time.sleep(0.05)


class Watchdog(threading.Thread):
    """Watches one process; when it dies unexpectedly, restarts it after the backoff and logs
    what died, how, and when it served again."""

    def __init__(self, unit: Supervised, backoff: Backoff, log: logging.Logger) -> None:
        super().__init__(name=f"watchdog-{unit.name}", daemon=True)
        self.unit = unit
        self.backoff = backoff
        self.log = log
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        failures = 0
        up_since = time.monotonic()
        while not self._stopping.wait(POLL_SECONDS):
            unit = self.unit
            if unit.alive() or not unit.wanted:
                continue
            died_at = time.monotonic()
            if died_at - up_since >= self.backoff.stable_after:
                failures = 0
            delay = self.backoff.delay(failures)
            failures += 1
            self.log.warning(
                "%s (pid %s) %s; restarting in %.1f s (failure %d in a row)", unit.name, unit.pid, describe_exit(unit.returncode),
                delay, failures,
            )
            if self._stopping.wait(delay):
                return
            try:
                if not unit.respawn():
                    continue
            except (RestartFailed, OSError) as error:
                self.log.error("%s did not start again: %s", unit.name, error)
                up_since = time.monotonic()
                continue
            up_since = time.monotonic()
            self._await_ready(died_at)

    def _await_ready(self, died_at: float) -> None:
        unit = self.unit
        while not self._stopping.wait(POLL_SECONDS):
            if not unit.alive():
                return  # died again while starting: the loop logs it and backs off further
            if unit.ready():
                self.log.info("%s is back (pid %s), %.1f s after it died", unit.name, unit.pid, time.monotonic() - died_at)
                return
