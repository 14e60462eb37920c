"""The worker's and beat's probes from deploy/k8s/base, run against the test session's real
worker and beat: the exact commands the kubelet runs, pointed at this stack's node name and
schedule file; each answers 0 for the live process and non-zero for a dead or stale one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from services.stack.supervisor import Stack

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s" / "base"


def container(manifest: str) -> dict[str, Any]:
    [deployment] = [d for d in yaml.safe_load_all((BASE / manifest).read_text()) if d and d["kind"] == "Deployment"]
    [main] = deployment["spec"]["template"]["spec"]["containers"]
    return main


def run(command: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def worker_ping_command(node: str) -> list[str]:
    """The liveness command with the pod's node name (celery@$HOSTNAME) replaced by `node`."""
    command = container("worker.yaml")["livenessProbe"]["exec"]["command"]
    assert '"celery@$HOSTNAME"' in command[2]
    return [command[0], command[1], command[2].replace('"celery@$HOSTNAME"', f'"{node}"')]


def test_worker_liveness_pings_the_live_worker_and_fails_for_a_missing_one(stack: Stack) -> None:
    env = stack.base_env() | {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    node = f"engram-{stack.config.gateway_port}@{socket.gethostname()}"  # the stack's -n
    deadline = time.monotonic() + 120
    while True:  # the worker may still be starting when this test runs first
        alive = run(worker_ping_command(node), env)
        if alive.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert "pong" in alive.stdout
    missing = run(worker_ping_command(f"celery@no-such-pod-{os.getpid()}"), env)
    assert missing.returncode != 0


def beat_probe(schedule: Path) -> list[str]:
    command = container("beat.yaml")["livenessProbe"]["exec"]["command"]
    assert "/tmp/celerybeat-schedule" in command[2]
    return [*command[:2], command[2].replace("/tmp/celerybeat-schedule", str(schedule))]


def test_beat_liveness_passes_for_the_live_beat_and_fails_for_a_stale_schedule(stack: Stack, tmp_path: Path) -> None:
    schedule = stack.data_dir / "celerybeat-schedule"  # the stack's beat -s
    deadline = time.monotonic() + 120
    while not list(stack.data_dir.glob("celerybeat-schedule*")) and time.monotonic() < deadline:
        time.sleep(1)
    env = dict(os.environ)
    python = [sys.executable]
    live = run(python + beat_probe(schedule)[1:], env)
    assert live.returncode == 0, live.stderr
    # The same files, last written an hour ago: a beat that stopped sending.
    stale = tmp_path / "celerybeat-schedule"
    for path in stack.data_dir.glob("celerybeat-schedule*"):
        copy = tmp_path / path.name
        shutil.copyfile(path, copy)
        old = time.time() - 3600
        os.utime(copy, (old, old))
    assert run(python + beat_probe(stale)[1:], env).returncode == 1
    # And none at all (a beat that never started).
    assert run(python + beat_probe(tmp_path / "absent" / "celerybeat-schedule")[1:], env).returncode == 1
