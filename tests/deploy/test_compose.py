"""docker-compose.yml and the Dockerfile: accepted by docker-compose, wired in start order,
every Engram process from the one image, and only env the app reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.env_contract import INFRA_ENV, build_settings, settings_aliases

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
HTTP_SERVICES = {"gateway": 57332, "recall": 57333, "ingest": 57334}
ENGRAM_SERVICES = {*HTTP_SERVICES, "worker", "beat", "migrate"}
# Stand-ins for what an operator exports before `docker-compose up`.
OPERATOR_ENV = {
    "MEMENTO_ACCESS_KEY": "test-only-master-key-0123456789abcdef",
    "ENGRAM_SERVICE_TOKEN": "test-only-service-token-0123456789abcdef",
    "ARTIFACT_TOKEN_SECRET": "test-only-artifact-secret-0123456789abcdef",
}


def raw_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # resolves the anchors and << merges


def docker_compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (make deploy-tools installs Debian's package)")
    clean = {k: v for k, v in os.environ.items() if k not in (*OPERATOR_ENV, "MCP_ALLOWED_HOSTS", "POSTGRES_PASSWORD")}
    return subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), *args],
        cwd=ROOT, env=clean | env, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.fixture(scope="module")
def resolved_compose() -> dict[str, Any]:
    """The file as docker-compose reads it: anchors merged, ${VARS} interpolated."""
    result = docker_compose("config", env=OPERATOR_ENV)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_docker_compose_accepts_the_file() -> None:
    result = docker_compose("config", "-q", env=OPERATOR_ENV)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", sorted(OPERATOR_ENV))
def test_docker_compose_refuses_to_run_without_each_secret(missing: str) -> None:
    result = docker_compose("config", "-q", env={k: v for k, v in OPERATOR_ENV.items() if k != missing})
    assert result.returncode != 0
    assert missing in result.stderr


def test_infrastructure_has_pgvector_and_healthchecks() -> None:
    services = raw_compose()["services"]
    assert services["postgres"]["image"].startswith("pgvector/pgvector:pg")
    assert services["redis"]["image"] == "redis:7-alpine"
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["redis"]


def test_every_engram_process_runs_from_the_one_image() -> None:
    services = raw_compose()["services"]
    assert ENGRAM_SERVICES <= set(services)
    for name in ENGRAM_SERVICES:
        assert services[name]["build"] == ".", name
    assert services["migrate"]["command"] == ["python", "-m", "shared.schema.migrate"]
    assert services["migrate"]["restart"] == "no"


@pytest.mark.parametrize("name", sorted(ENGRAM_SERVICES - {"migrate"}))
def test_service_starts_after_migrations(name: str) -> None:
    depends = raw_compose()["services"][name]["depends_on"]
    assert depends["migrate"] == {"condition": "service_completed_successfully"}
    assert depends["postgres"] == {"condition": "service_healthy"}
    assert depends["redis"] == {"condition": "service_healthy"}


def test_gateway_waits_for_healthy_upstreams() -> None:
    depends = raw_compose()["services"]["gateway"]["depends_on"]
    assert depends["recall"] == depends["ingest"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", sorted(HTTP_SERVICES))
def test_http_service_healthcheck_gets_health(name: str) -> None:
    service = raw_compose()["services"][name]
    port = HTTP_SERVICES[name]
    assert service["command"][-2:] == ["--port", str(port)]
    test = service["healthcheck"]["test"]
    # python:3.11-slim has no curl: the check is urllib, which raises on a 503.
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"http://127.0.0.1:{port}/health" in test[3]


def test_beat_runs_once() -> None:
    beat = raw_compose()["services"]["beat"]
    assert "beat" in beat["command"] and "scale" not in beat and "deploy" not in beat


def test_only_the_gateway_is_published() -> None:
    services = raw_compose()["services"]
    assert [name for name, s in services.items() if s.get("ports")] == ["gateway"]


@pytest.mark.parametrize("name", sorted(ENGRAM_SERVICES))
def test_service_env_is_read_by_the_app(name: str) -> None:
    env = raw_compose()["services"][name]["environment"]
    unknown = set(env) - settings_aliases() - INFRA_ENV
    assert not unknown, f"env vars no settings class reads: {sorted(unknown)}"


@pytest.mark.parametrize("name", sorted(ENGRAM_SERVICES))
def test_service_env_parses_into_settings(
    name: str, resolved_compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = resolved_compose["services"][name]
    env = {key: str(value) for key, value in service["environment"].items()}
    build_settings(monkeypatch, service["command"], env)


def test_dockerfile_builds_the_image_the_deploy_files_expect() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", dockerfile, re.M)
    # torch first and pinned, then the project.
    torch = dockerfile.index("torch==2.13.0")
    assert torch < dockerfile.index("pip install .")
    # The ONNX export happens at build time into the path the deploy files point at.
    assert "EMBEDDING_CACHE_DIR=/opt/engram/models" in dockerfile
    assert "python -m shared.embeddings.prepare" in dockerfile
    assert "HF_HUB_OFFLINE=1" in dockerfile
    users = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_dockerignore_keeps_the_context_to_what_the_image_copies() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*"
    assert {"!pyproject.toml", "!shared/", "!services/"} <= set(rules)
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert f"!{source}" in rules or f"!{source}/" in rules, source


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_callers_of_the_internal_services_can_reach_them(name: str, resolved_compose: dict[str, Any]) -> None:
    env = resolved_compose["services"][name]["environment"]
    assert env["RECALL_URL"] == "http://recall:57333"
    assert env["INGEST_URL"] == "http://ingest:57334"
    assert env["ENGRAM_SERVICE_TOKEN"]
