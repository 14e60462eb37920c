"""The admin /logs routes read the services' log files in LOG_DIR and nothing outside it; a
gateway without LOG_DIR (stdout only) says so."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Gateway, start_gateway
from tests.support import Stack

ADMIN = "/v1/internal/model/nothing"


def admin(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url + ADMIN, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
def sample_log(stack: Stack) -> Iterator[str]:
    """A log file of known lines in the stack's log folder, in each format the reader knows."""
    now = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
    name = f"sample-{uuid.uuid4().hex[:8]}.log"
    path = stack.log_dir / name
    path.write_text(
        f"{now},101 INFO services.x [cid=a trace=-] first marker-alpha\n"
        f"{now},102 ERROR services.x [cid=b trace=-] failed marker-beta\n"
        "Traceback (most recent call last):\n"
        "  ValueError: marker-gamma\n"
        f"[{now},103: WARNING/MainProcess] celery says marker-delta\n"
        "INFO:     uvicorn says marker-epsilon\n"
        f'{{"timestamp": "{now}", "level": "ERROR", "message": "json marker-zeta"}}\n'
    )
    yield name
    path.unlink(missing_ok=True)


def test_files_read_and_stats(stack: Stack, sample_log: str) -> None:
    with admin(stack.gateway_url, stack.master_key) as http:
        files = http.get("/logs/files").json()
        assert files["enabled"] and Path(files["logDir"]) == stack.log_dir.resolve()
        names = {f["name"]: f for f in files["files"]}
        assert {"gateway.log", "ingest.log", sample_log} <= set(names)
        assert names[sample_log]["size"] == (stack.log_dir / sample_log).stat().st_size
        assert files["totalSize"] >= sum(f["size"] for f in files["files"])

        everything = http.get("/logs/read", params={"file": sample_log}).json()
        assert everything["total"] == 5 and everything["filtered"] == 5
        levels = [line["level"] for line in everything["lines"]]
        assert levels == ["info", "error", "warning", "info", "error"]
        assert everything["lines"][1]["message"].endswith("marker-beta\nTraceback (most recent call last):\n  ValueError: marker-gamma")
        assert everything["lines"][3]["timestamp"] is None and everything["lines"][4]["message"] == "json marker-zeta"

        errors = http.get("/logs/read", params={"file": sample_log, "level": "error"}).json()
        assert [line["message"].split("\n")[0][-18:] for line in errors["lines"]] == ["failed marker-beta", "json marker-zeta"[-18:]]
        assert errors["total"] == 5 and errors["filtered"] == 2
        assert [x["level"] for x in http.get("/logs/read", params={"file": sample_log, "level": "warn"}).json()["lines"]] == ["warning"]
        found = http.get("/logs/read", params={"file": sample_log, "search": "MARKER-GAMMA"}).json()
        assert found["filtered"] == 1 and "marker-beta" in found["lines"][0]["message"]
        last = http.get("/logs/read", params={"file": sample_log, "tail": 2}).json()
        assert [x["message"] for x in last["lines"]] == ["uvicorn says marker-epsilon", "json marker-zeta"]
        assert http.get("/logs/read", params={"file": sample_log, "level": "loud"}).status_code == 400
        assert http.get("/logs/read").status_code == 400
        assert http.get("/logs/read", params={"file": "absent.log"}).status_code == 404

        # the services' own files: the Celery worker logs its start-up at INFO
        worker = http.get("/logs/read", params={"file": "worker.log", "tail": 3, "level": "info"}).json()
        assert worker["filtered"] >= 1 and 1 <= len(worker["lines"]) <= 3
        assert all(line["level"] == "info" and line["timestamp"] for line in worker["lines"])

        stats = http.get("/logs/stats").json()
        assert stats["enabled"] and stats["fileCount"] >= 3 and stats["totalSizeBytes"] > 0
        assert stats["today"]["error"] >= 2 and stats["today"]["warning"] >= 1
        assert any(e["file"] == sample_log and e["message"] == "json marker-zeta" for e in stats["recentErrors"])
        assert stats["disk"]["total"] > 0 and 0 <= stats["disk"]["percent"] <= 100


def test_read_never_leaves_the_log_folder(stack: Stack, tmp_path: Path) -> None:
    outside = tmp_path / "secret.log"
    outside.write_text("2026-01-01 00:00:00,000 INFO x outside-secret\n")
    link = stack.log_dir / f"link-{uuid.uuid4().hex[:6]}.log"
    os.symlink(outside, link)
    folder = stack.log_dir / f"dir-{uuid.uuid4().hex[:6]}.log"
    folder.mkdir()
    try:
        with admin(stack.gateway_url, stack.master_key) as http:
            for name in (
                "../main/logs/gateway.log", f"../{stack.log_dir.name}/gateway.log", str(outside), "/etc/passwd",
                "..", ".", ".hidden.log", "gateway.log/..", "gateway", "gateway.txt", "..%2Fgateway.log",
                "%2e%2e%2fgateway.log", "sub/gateway.log", "sub\\gateway.log",
            ):
                response = http.get("/logs/read", params={"file": name})
                assert response.status_code in (400, 403, 404), (name, response.status_code)
                assert "outside-secret" not in response.text and "root:" not in response.text
            # a symlink in the folder pointing out, and a directory named like a log
            assert http.get("/logs/read", params={"file": link.name}).status_code == 403
            assert http.get("/logs/read", params={"file": folder.name}).status_code == 403
            # NUL never reaches the file system
            assert http.get(f"{stack.gateway_url}{ADMIN}/logs/read?file=gateway.log%00.txt").status_code == 422
            # an encoded separator in the raw query is decoded first, then refused
            assert http.get(f"{stack.gateway_url}{ADMIN}/logs/read?file=..%2F..%2Fetc%2Fpasswd").status_code == 400
            assert link.name not in {f["name"] for f in http.get("/logs/files").json()["files"]}
    finally:
        link.unlink()
        folder.rmdir()


@pytest.fixture(scope="module")
def stdout_gateway(stack: Stack) -> Iterator[Gateway]:
    proc, gateway = start_gateway(stack, "gateway-stdout", 5, {"LOG_DIR": ""})
    try:
        yield gateway
    finally:
        proc.stop()


def test_a_deployment_logging_to_stdout_says_so(stdout_gateway: Gateway) -> None:
    with admin(stdout_gateway.url, stdout_gateway.master_key) as http:
        for path, params in (("/logs/files", {}), ("/logs/read", {"file": "gateway.log"}), ("/logs/stats", {})):
            response = http.get(path, params=params)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["enabled"] is False and "stdout" in body["message"]
        assert http.get("/logs/files").json()["files"] == []
        assert http.get("/logs/read", params={"file": "gateway.log"}).json()["lines"] == []
