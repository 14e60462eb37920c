"""The embedded Postgres is sized to the machine (services/stack/postgres.py, memory_settings):
shared_buffers a third of the memory the stack may use unless ENGRAM_PG_SHARED_BUFFERS says,
effective_cache_size three quarters, and pg_prewarm's autoprewarm worker brings the buffers'
pages back after a restart. At 1M fragments the fixed 2 GB held under a quarter of the vector
layer's hot pages (issue 22; bench/README.md, session 16)."""

from __future__ import annotations

import asyncpg
import psutil
import pytest

from services.stack import postgres
from tests.support import Stack

MB = 2**20


async def _setting_bytes(conn: asyncpg.Connection, name: str) -> int:
    """A memory setting in bytes (pg_settings gives it in its unit: 8 kB pages for both)."""
    setting, unit = await conn.fetchrow("SELECT setting::bigint, unit FROM pg_settings WHERE name = $1", name)
    assert unit == "8kB"
    return int(setting) * 8192


async def test_the_stack_s_postgres_is_sized_to_the_machine_and_keeps_its_buffers_across_restarts(stack: Stack) -> None:
    total = postgres.memory_bytes()
    conn = await asyncpg.connect(stack.database_url)
    try:
        shared = await _setting_bytes(conn, "shared_buffers")
        cache = await _setting_bytes(conn, "effective_cache_size")
        preload = await conn.fetchval("SHOW shared_preload_libraries")
        autoprewarm = await conn.fetchval("SHOW pg_prewarm.autoprewarm")
    finally:
        await conn.close()
    # Within a page of the share (settings are whole MB); far from the old fixed 2 GB on a
    # machine of any other size.
    assert abs(shared - total * postgres.SHARED_BUFFERS_SHARE) <= MB + 8192
    assert abs(cache - total * postgres.CACHE_SHARE) <= MB + 8192
    assert preload == "pg_prewarm" and autoprewarm == "on"
    # The worker that dumps and reloads the buffer list runs beside the postmaster (it does
    # not show in pg_stat_activity).
    assert stack.postgres is not None and stack.postgres.process is not None
    assert "autoprewarm leader" in _children_titles(stack.postgres.process.pid)


def _children_titles(pid: int) -> str:
    """The process titles of the postmaster's children. A backend that has just exited is a
    zombie until the postmaster reaps it and has no command line to read: it is skipped."""
    titles = []
    for child in psutil.Process(pid).children():
        try:
            titles.append(" ".join(child.cmdline()))
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return "\n".join(titles)


def test_the_memory_settings_follow_the_machine_and_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_PG_SHARED_BUFFERS", raising=False)
    monkeypatch.setattr(postgres, "memory_bytes", lambda: 24 * 1024 * MB)
    assert postgres.memory_settings() == {"shared_buffers": "8192MB", "effective_cache_size": "18432MB"}
    monkeypatch.setattr(postgres, "memory_bytes", lambda: 256 * MB)  # a small container: the floors
    assert postgres.memory_settings() == {"shared_buffers": "128MB", "effective_cache_size": "512MB"}
    monkeypatch.setenv("ENGRAM_PG_SHARED_BUFFERS", "3GB")
    assert postgres.memory_settings()["shared_buffers"] == "3GB"


def test_pg_stat_statements_is_preloaded_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_PG_STAT_STATEMENTS", raising=False)
    assert postgres.preload_libraries() == "pg_prewarm"
    for value, loaded in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("ENGRAM_PG_STAT_STATEMENTS", value)
        assert postgres.preload_libraries() == ("pg_prewarm,pg_stat_statements" if loaded else "pg_prewarm"), value
    monkeypatch.setenv("ENGRAM_PG_STAT_STATEMENTS", "maybe")  # not a boolean: said, not taken as off
    with pytest.raises(ValueError):
        postgres.preload_libraries()


def test_a_cgroup_limit_below_the_machine_s_memory_is_what_counts(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    limit = tmp_path / "memory.max"
    real_path = postgres.Path

    def path(name: str) -> object:
        return limit if name == "/sys/fs/cgroup/memory.max" else real_path(name)

    monkeypatch.setattr(postgres, "Path", path)
    limit.write_text(f"{512 * MB}\n")
    assert postgres.memory_bytes() == 512 * MB
    limit.write_text("max\n")  # no limit: the machine's memory
    assert postgres.memory_bytes() > 512 * MB
