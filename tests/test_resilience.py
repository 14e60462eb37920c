"""Degraded dependencies, each on a stack of its own: Postgres down, Redis down or disabled,
and the `make run` entry point's start / Ctrl-C / restart cycle."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest

from shared.db import SEARCH_PATH
from tests.support import Stack, call, mcp_session, new_stack_config, running, unique
from services.stack.supervisor import free_port


def _wait_for(predicate, timeout: float = 30.0, interval: float = 0.25):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def test_postgres_down_makes_gateway_unhealthy(stack_dir: Path) -> None:
    with Stack(new_stack_config(stack_dir / "pgdown", worker=False, beat=False, redis_url=None)) as own:
        assert httpx.get(f"{own.gateway_url}/health").status_code == 200
        assert own.postgres is not None
        own.postgres.stop()
        response = _wait_for(lambda: (r := httpx.get(f"{own.gateway_url}/health", timeout=10)).status_code == 503 and r)
        assert response, "gateway kept answering 200 with Postgres stopped"
        body = response.json()
        assert body["status"] == "degraded" and body["checks"]["database"]["status"] == "down"


async def test_redis_unreachable_still_serves(stack: Stack, stack_dir: Path) -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    async with running(new_stack_config(stack_dir / "redisdown", database_url=stack.database_url, redis_url=dead_redis, worker=False, beat=False)) as own:
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{own.gateway_url}/health")
        assert health.status_code == 200
        body = health.json()
        assert body["status"] == "healthy" and body["checks"]["redis"]["status"] == "warning"
        assert any("Redis" in w for w in body["warnings"])
        ws = unique()
        async with mcp_session(own.mcp_url, own.master_key) as s:
            first = await call(s, "remember", {"content": "Grafana alerts page the on-call engineer via PagerDuty.", "topic": "alerts", "type": "fact", "workspace": ws})
            second = await call(s, "remember", {"content": "Grafana alerting pages whoever is on call through PagerDuty.", "topic": "alerts", "type": "fact", "workspace": ws})
            found = await call(s, "recall", {"text": "who gets notified when an alert fires", "workspace": ws})
        assert {first["id"], second["id"]} <= {f["id"] for f in found["fragments"]}
        # With no broker the post-commit job runs inline, in ingest's relay (after its linger):
        # nothing waits for a worker that isn't there.
        conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
        try:
            for _ in range(200):
                if not await conn.fetchval("SELECT count(*) FROM fragment_link_pending WHERE fragment_id = $1", second["id"]):
                    break
                await asyncio.sleep(0.05)
            assert not await conn.fetchval("SELECT count(*) FROM fragment_link_pending WHERE fragment_id = $1", second["id"])
            assert await conn.fetchval(
                "SELECT count(*) FROM fragment_links WHERE from_id = $1 AND to_id = $2 AND relation_type = 'related'",
                second["id"], first["id"],
            )
        finally:
            await conn.close()


async def test_redis_disabled_is_reported_disabled(stack: Stack, stack_dir: Path) -> None:
    async with running(new_stack_config(stack_dir / "redisoff", database_url=stack.database_url, redis_enabled=False)) as own:
        assert "worker" not in own.processes  # Celery needs a broker; the core does not
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{own.gateway_url}/health")
        assert health.status_code == 200 and health.json()["checks"]["redis"]["status"] == "disabled"
        async with mcp_session(own.mcp_url, own.master_key) as s:
            ws = unique()
            stored = await call(s, "remember", {"content": "Feature flags are managed in LaunchDarkly per environment.", "topic": "flags", "type": "fact", "workspace": ws})
            found = await call(s, "recall", {"keywords": ["launchdarkly"], "workspace": ws})
        assert found["fragments"][0]["id"] == stored["id"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stack_env(data_dir: Path, gateway_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ENGRAM_DATA_DIR": str(data_dir), "PORT": str(gateway_port), "RECALL_PORTS": str(free_port()),
        "INGEST_PORT": str(free_port()), "ENGRAM_PG_PORT": str(free_port()), "ENGRAM_REDIS_PORT": str(free_port()),
    })
    env.pop("MEMENTO_ACCESS_KEY", None)
    env.pop("DATABASE_URL", None)
    return env


def _run_stack(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.stack", "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    output = []
    deadline = time.monotonic() + 240
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output.append(line)
        if "Ctrl-C stops everything" in line:
            return proc, "".join(output)
    proc.kill()
    raise AssertionError("stack did not start:\n" + "".join(output[-40:]))


def _remembers(port: int, key: str, ws: str) -> bool:
    async def remember() -> bool:
        async with asyncio.timeout(30), mcp_session(f"http://127.0.0.1:{port}/mcp", key) as s:
            reply = await call(s, "remember", {"content": f"Restart probe {unique()}: the canary passed.", "topic": "release", "type": "fact", "workspace": ws})
        return bool(reply.get("id"))

    try:
        return asyncio.run(remember())
    # While ingest is down the call fails in whichever way; only that it works again counts.
    except Exception:  # noqa: BLE001
        return False


def test_run_prints_url_and_key_stops_everything_and_keeps_data(stack_dir: Path) -> None:
    data_dir = stack_dir / "make-run"
    port = free_port()
    env = _stack_env(data_dir, port)
    proc, output = _run_stack(env)
    try:
        assert f"MCP URL:     http://127.0.0.1:{port}/mcp" in output
        key = (data_dir / "master_key").read_text().strip()
        assert f"Master key:  {key}" in output
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for expected in ("services.gateway.app", "services.recall.app", "services.ingest.app", "worker", "beat", "redis-server"):
            assert expected in names
        ws = unique()

        async def remember() -> str:
            async with mcp_session(f"http://127.0.0.1:{port}/mcp", key) as s:
                return (await call(s, "remember", {"content": "The release train leaves every second Thursday.", "topic": "release", "type": "fact", "workspace": ws}))["id"]

        fragment_id = asyncio.run(remember())

        # One dead service no longer ends the run: it is started again and says so.
        ingest = next(c for c in children if "services.ingest.app" in " ".join(c.cmdline()))
        ingest.kill()
        assert _wait_for(lambda: _remembers(port, key, ws), timeout=180), "ingest was not restarted"
        supervisor_log = data_dir / "logs" / "supervisor.log"
        # The watchdog notices it answers a poll after the first caller may have.
        assert _wait_for(lambda: "ingest is back" in supervisor_log.read_text()), supervisor_log.read_text()
        assert f"ingest (pid {ingest.pid}) killed by SIGKILL" in supervisor_log.read_text()
        assert proc.poll() is None
        children = psutil.Process(proc.pid).children(recursive=True)
        pg_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    assert proc.returncode == 0
    time.sleep(0.5)
    leftovers = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert leftovers == [], f"left behind: {[c.cmdline() for c in leftovers]}"
    assert not _alive(pg_pid), "embedded Postgres still running after Ctrl-C"

    # Second run: same key, same data.
    env = _stack_env(data_dir, port)
    proc, output = _run_stack(env)
    try:
        assert f"Master key:  {key}" in output

        async def recall() -> list[str]:
            async with mcp_session(f"http://127.0.0.1:{port}/mcp", key) as s:
                return [f["id"] for f in (await call(s, "recall", {"keywords": ["release"], "workspace": ws}))["fragments"]]

        assert fragment_id in asyncio.run(recall())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
