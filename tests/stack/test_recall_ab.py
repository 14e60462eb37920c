"""bench.recall_ab's parts: REV's version of a module loaded beside the working tree's, the ABBA
order, the swap put back, and the CPU it reads from /proc for Postgres' backends."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import asyncpg
import pytest

from bench.loading import cpu_seconds
from bench.recall_ab import backends_cpu, module_at, swapped, variant
from tests.support import Stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _repository_with(root: Path, path: str, text: str) -> Path:
    """A new git repository at `root` whose first commit holds `text` at `path`."""
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "bench@example.invalid")
    _git(root, "config", "user.name", "bench")
    module = root / path
    module.parent.mkdir()
    module.write_text(text)
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "first")
    return module


def test_a_module_is_loaded_as_it_was_at_the_revision(tmp_path: Path) -> None:
    """A at REV, B in the working tree: the file on disk has moved on, the loaded module has not."""
    module = _repository_with(tmp_path, "pkg/layer.py", "LIMIT = 60\n\ndef depth() -> int:\n    return LIMIT\n")
    first = _git(tmp_path, "rev-parse", "HEAD")
    module.write_text("LIMIT = 80\n\ndef depth() -> int:\n    return LIMIT\n")
    _git(tmp_path, "commit", "-qam", "second")

    then = module_at(first, "pkg/layer.py", root=tmp_path)
    now = module_at("HEAD", "pkg/layer.py", root=tmp_path)
    assert then.__name__ == f"pkg.layer@{first}"
    assert then.depth() == 60 and now.depth() == 80
    with pytest.raises(subprocess.CalledProcessError):
        module_at(first, "pkg/missing.py", root=tmp_path)


def test_a_module_with_a_dataclass_loads_at_a_revision(tmp_path: Path) -> None:
    """A dataclass looks its module up in sys.modules (services/recall/search.py has several)."""
    _repository_with(tmp_path, "pkg/shapes.py", "from dataclasses import dataclass\n\n@dataclass\nclass Box:\n    side: int = 2\n")
    loaded = module_at("HEAD", "pkg/shapes.py", root=tmp_path)
    assert loaded.Box().side == 2 and loaded.Box.__module__ == loaded.__name__


def test_the_versions_alternate_abba() -> None:
    order = "".join(variant(i) for i in range(12))
    assert order == "ABBAABBAABBA"
    assert order.count("A") == order.count("B")


def test_the_swapped_function_is_put_back_even_after_an_error() -> None:
    module = types.ModuleType("layer")
    module.depth = lambda: 60  # type: ignore[attr-defined]
    original = module.depth  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), swapped(module, "depth") as put:
        put(lambda: 80)
        assert module.depth() == 80  # type: ignore[attr-defined]
        raise RuntimeError("a recall failed")
    assert module.depth is original  # type: ignore[attr-defined]


async def test_a_backend_s_cpu_is_counted_for_its_own_work_only(stack: Stack) -> None:
    """What the tool reads as a recall's Postgres CPU: the backends of its own connections. One
    that sums a few million rows shows the time; an idle one beside it does not."""
    busy = await asyncpg.connect(stack.database_url)
    idle = await asyncpg.connect(stack.database_url)
    try:
        pids = [int(await c.fetchval("SELECT pg_backend_pid()")) for c in (busy, idle)]
        before = [cpu_seconds(pid) for pid in pids]
        together = backends_cpu(pids)
        await busy.fetchval("SELECT sum(g) FROM generate_series(1, 5000000) g")
        after = [cpu_seconds(pid) for pid in pids]
    finally:
        await busy.close()
        await idle.close()
    assert after[0] - before[0] >= 0.05
    assert after[1] - before[1] <= 0.02
    assert together == pytest.approx(sum(before), abs=0.02)  # the pool's backends summed
