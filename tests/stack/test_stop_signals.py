"""A process that runs a Stack in the foreground (`python -m services.stack run`, the growth
bench's --serve) stops it on SIGTERM and on SIGINT, also when it was started with SIGINT
ignored, as a shell starts a background job (services/stack/supervisor.py,
interrupt_on_stop_signals). Before, SIGTERM ended such a process on the spot and an ignored
SIGINT did nothing: either way its Postgres, Redis and services were left running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# Stands for the foreground process: what its `finally` does is what Stack.stop() would do.
PROGRAM = """
import sys, time
from services.stack.supervisor import interrupt_on_stop_signals
interrupt_on_stop_signals()
try:
    print("ready", flush=True)  # inside the try: a signal may come as soon as it is read
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
finally:
    time.sleep(0.5)  # a second signal during the clean-up must not cut it short
    print("stopped everything", flush=True)
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_runs_the_clean_up_once(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint,  # noqa: PLW1509
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        time.sleep(0.1)
        proc.send_signal(sig)  # the impatient second one, during the clean-up
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.split() == ["interrupted", "stopped", "everything"]
    assert proc.returncode == 0
