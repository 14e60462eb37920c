"""The benches' CPU accounting of a stack (bench.loading): the processes it finds and the CPU
it reads for them from /proc, which the ingest bench's per-CPU rates and recall_load's CPU per
recall are made of."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bench.loading import stack_cpu_by_process, stack_processes
from services.stack.supervisor import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A child that burns this much CPU, then exits and is reaped by its parent.
BURN_S = 0.4


@contextmanager
def running(script: str, *argv: str) -> Iterator[subprocess.Popen[str]]:
    """A Python process running `script` in a session of its own, stopped afterwards with
    everything it started; it prints 'ready' when set."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *argv], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # with whatever it started
        proc.wait()


BURN_AND_REAP = f"""
    import os, time
    pid = os.fork()
    if pid == 0:
        began = time.process_time()
        while time.process_time() - began < {BURN_S}:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_child_that_exits_between_readings_still_counts() -> None:
    """A Postgres backend or autovacuum worker that exits is gone from /proc; its CPU is then
    in its parent's cutime / cstime. Counting only a process's own time lost it."""
    with running(BURN_AND_REAP) as service:
        found = stack_processes()
        assert found is not None
        cpu, _, counted = found
        assert service.pid in counted
        assert cpu[service.pid] >= BURN_S * 0.9


def test_a_stack_another_process_serves_is_found_by_its_postgres_port() -> None:
    """recall_load --reuse measures a stack it did not start: the processes below the parent of
    the Postgres listening on its DATABASE_URL's port (embedded Postgres is started with
    `-c port=N`)."""
    port = free_port()
    # The stand-in for growth_bench --serve: a 'postmaster' with Postgres' port argument and a
    # 'recall' service that burns CPU through a reaped child, both below it.
    serve = f"""
        import subprocess, sys, time
        postgres = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "postgres", "-c", "port={port}"])
        service = subprocess.Popen([sys.executable, "-c", {textwrap.dedent(BURN_AND_REAP)!r}, "services.recall.app"],
                                   stdout=subprocess.PIPE, text=True)
        service.stdout.readline()
        print("ready", flush=True)
        time.sleep(60)
    """
    with running(serve):
        spent = stack_cpu_by_process(f"postgresql://postgres@127.0.0.1:{port}/engram")
        assert spent.get("recall", 0.0) >= BURN_S * 0.9
        assert "postgres" in spent
        assert stack_cpu_by_process(f"postgresql://postgres@127.0.0.1:{free_port()}/engram") == {}
