"""A real Prometheus (Debian's package, `make prometheus-tools`) against a running stack: it
scrapes every service and the worker, loads deploy/prometheus/rules.yml (which promtool checks
and unit-tests for every alert), answers recall's p95 by tool, and has every series the Grafana
dashboard in deploy/grafana/ charts."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from services.stack.supervisor import free_port
from shared.db import SEARCH_PATH
from tests.support import Stack, call, create_api_key, mcp_session, unique

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "engram.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason="Debian's prometheus package (make prometheus-tools)")

RECALL_P95_BY_TOOL = (
    'histogram_quantile(0.95, sum by (tool, le) (rate(engram_tool_call_duration_seconds_bucket{service="recall"}[30s])))'
)


def _alerts() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_alert_rules_load_and_every_alert_has_a_unit_test_that_passes() -> None:
    checked = subprocess.run(  # noqa: S603 - our own argument list
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)  # type: ignore[list-item]
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = _alerts()
    assert f"SUCCESS: {len(alerts)} rules found" in checked.stdout
    assert {"EngramHighErrorRate", "EngramRecallLatencyHigh", "EngramQueueBacklog", "EngramBatchDeadLetters",
            "EngramPostgresDown", "EngramRedisDown", "EngramConsolidationFailing"} <= alerts
    # Every alert has a case in which it fires (and the file's cases all pass).
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert fired == alerts, f"alerts without a firing unit test: {alerts - fired}"
    tested = subprocess.run(  # noqa: S603 - our own argument list
        [PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, check=False)  # type: ignore[list-item]
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def scrape_config(stack: Stack, rules: Path) -> dict[str, Any]:
    """What an operator writes: one job per service (every recall replica) and the worker."""
    config = stack.config

    def job(name: str, ports: list[int]) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}

    return {
        # 2 s: a scrape of the worker (its pool files and the Redis queues) fits on a loaded 2-core machine.
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            job("engram-gateway", [config.gateway_port]),
            job("engram-recall", list(config.recall_ports)),
            job("engram-ingest", [config.ingest_port]),
            job("engram-worker", [config.worker_metrics_port]),
        ],
    }


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text(yaml.safe_dump(scrape_config(stack, RULES)))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    process = subprocess.Popen(  # noqa: S603 - our own argument list
        [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",  # type: ignore[list-item]
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (work / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Prometheus not ready in 60 s"
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


async def _api(http: httpx.AsyncClient, path: str, **params: str) -> Any:
    reply = (await http.get(path, params=params)).json()
    assert reply["status"] == "success", reply
    return reply["data"]


async def _until(check: Any, what: str, seconds: float = 90) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"not within {seconds:.0f} s: {what}"
        await asyncio.sleep(1)


@pytest.fixture(scope="module")
async def scraped(prometheus: str, stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """Prometheus scraping every target, and a workload it has seen: writes, a recall twice
    (an L1 miss and a hit), a refused call, and a consolidation run in the worker."""
    async with httpx.AsyncClient(base_url=prometheus, timeout=10) as http:
        async def all_up() -> bool:
            targets = (await _api(http, "/api/v1/targets"))["activeTargets"]
            jobs = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            return jobs == {"engram-gateway", "engram-recall", "engram-ingest", "engram-worker"} and all(
                t["health"] == "up" for t in targets)

        await _until(all_up, "every target up")
        key, _ = await create_api_key(stack.database_url)
        ws = unique("prom")
        async with mcp_session(stack.mcp_url, key) as s:
            await call(s, "batch_remember", {"workspace": ws, "fragments": [
                {"content": f"The {name} service is deployed with a canary stage first.", "topic": "ops", "type": "fact"}
                for name in ("billing", "search", "mailer")]})
            for _ in range(2):
                await call(s, "recall", {"text": "how are services deployed", "workspace": ws})
            with pytest.raises(Exception):  # noqa: B017 - an error reply of any code; its kind is counted
                await call(s, "recall", {"workspace": ws})
        async with mcp_session(stack.mcp_url, stack.master_key) as s:
            report = await call(s, "memory_consolidate", {"stages": ["ttl_tiers", "exact_dedup"]})
        if report.get("queued"):  # the suite's single worker was busy past the tool's 25 s wait
            report = await _until(lambda: _run_done(stack, report["runId"]), "the consolidation run", seconds=300)
        assert report["success"] is True, report
        yield http


async def _run_done(stack: Stack, run_id: int) -> dict[str, Any] | None:
    """The run's outcome once the worker has finished it, as memory_consolidate reports it."""
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        status = await conn.fetchval("SELECT status FROM maintenance_runs WHERE id = $1", run_id)
    finally:
        await conn.close()
    return {"success": status == "succeeded", "status": status} if status not in ("queued", "running") else None


async def test_prometheus_scrapes_every_service_and_answers_recall_p95_by_tool(
    scraped: httpx.AsyncClient, stack: Stack,
) -> None:
    key, _ = await create_api_key(stack.database_url)

    async def p95_by_tool() -> list[dict[str, Any]]:
        # New observations while the 30 s window fills, so rate() has two samples to compare.
        async with mcp_session(stack.mcp_url, key) as s:
            await call(s, "recall", {"text": f"release checklist {unique('q')}"})
        result = await _api(scraped, "/api/v1/query", query=RECALL_P95_BY_TOOL)
        return [r for r in result["result"] if r["metric"].get("tool") == "recall" and not math.isnan(float(r["value"][1]))]

    series = await _until(p95_by_tool, "recall p95 by tool")
    assert 0 < float(series[0]["value"][1]) < 30
    # The rules in deploy/ are loaded by a real Prometheus and evaluate without errors.
    groups = (await _api(scraped, "/api/v1/rules"))["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {r["name"] for r in rules} == _alerts()
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    # The worker's endpoint carries the Redis queues' depths, read at scrape time.
    queues = (await _api(scraped, "/api/v1/query", query='engram_queue_depth{job="engram-worker"}'))["result"]
    assert {q["metric"]["queue"] for q in queues} == {
        "celery_maintenance", "celery_batch", "batch_jobs", "batch_processing", "recall_effects"}


def _panel_series(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:engram|mcp)_[a-z0-9_]+|up)\b(?=\s*[{\[)]|\s*$)", expr))


async def test_every_dashboard_panel_charts_series_present_in_the_scrape(scraped: httpx.AsyncClient) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    charted: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            series = _panel_series(target["expr"])
            assert series, f"{panel['title']}: no series in {target['expr']!r}"
            charted[panel["title"]] = charted.get(panel["title"], set()) | series

    async def missing_series() -> dict[str, list[str]]:
        names = set(await _api(scraped, "/api/v1/label/__name__/values"))
        return {title: sorted(series - names) for title, series in charted.items() if series - names}

    # Each panel's query also returns data from this stack (not just a name that exists).
    async def empty_panels() -> list[str]:
        empty = []
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                if not (await _api(scraped, "/api/v1/query", query=expr))["result"]:
                    empty.append(panel["title"])
        return empty

    # A series that has just appeared (the consolidation's, in the worker) needs a scrape, and
    # rate() / increase() two, before Prometheus answers it.
    deadline = time.monotonic() + 90
    for _ in range(180):
        missing, empty = await missing_series(), await empty_panels()
        if not (missing or empty) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    assert not missing, f"panels charting series no target exports: {missing}"
    assert not empty, f"panels with no data: {empty}"
