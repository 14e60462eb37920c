"""A service that cannot bind its port exits, so the supervisor starts it again later. One that
stayed alive without listening would never be restarted: the gateway's event hub once swallowed
the shutdown's cancel (redis-py) and read on for ever after "address already in use"."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import Stack

# How long a refused service may take to load and shut down again on two busy cores: a bound
# on "it exits at all", not a speed.
EXIT_SECONDS = 120


@pytest.mark.parametrize("name", ["gateway", "recall-0", "ingest"])
def test_a_service_whose_port_is_taken_exits_with_an_error(stack: Stack, name: str) -> None:
    running = stack.processes[name]  # serving: its port is the one taken
    log = stack.log_dir / f"{name}-port-taken.log"
    with log.open("wb") as out:
        second = subprocess.Popen(running.argv, env=running.env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = second.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
            pytest.fail(f"{name} with its port taken was still running after {EXIT_SECONDS} s:\n{log.read_text()}")
    output = log.read_text()
    assert "address already in use" in output, output
    assert code != 0, output
    assert running.alive()  # the one serving was not disturbed
