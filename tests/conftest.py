"""One real Engram stack per test session: embedded Postgres + pgvector, Redis, the three
services as processes, a Celery worker and beat. Tests talk to it over MCP and HTTP."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Stack, new_stack_config


@pytest.fixture(scope="session")
def stack_dir() -> Iterator[Path]:
    # Outside /root: embedded Postgres makes its data dir's parents world-readable.
    path = Path(tempfile.mkdtemp(prefix="engram-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(stack_dir: Path) -> Iterator[Stack]:
    config = new_stack_config(stack_dir / "main", master_key="test-master-key")
    with Stack(config) as running:
        yield running


@pytest.fixture(scope="session")
def mcp_url(stack: Stack) -> str:
    return stack.mcp_url


@pytest.fixture(scope="session")
def master_key(stack: Stack) -> str:
    return stack.master_key


# A failed test against the stack carries the tail of the worker's and supervisor's logs in its
# report: a clean-clone CI run keeps nothing else of the stack (its temp dir is removed).
STACK_LOGS = ("worker.log", "supervisor.log")
LOG_TAIL_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    running = getattr(item, "funcargs", {}).get("stack")
    if report.failed and call.when == "call" and isinstance(running, Stack):
        for name in STACK_LOGS:
            path = running.log_dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                report.sections.append((f"stack {name} (last {LOG_TAIL_LINES} lines)", "\n".join(tail)))
    return report
