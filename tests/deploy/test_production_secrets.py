"""ENGRAM_ENV=production refuses every placeholder or default secret the repository ships
(the manifests' REPLACE_ME values, the code's dev defaults, compose's old default service token)
and empty or short ones: in the settings, and as a process that exits non-zero at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.settings import DEV_MASTER_KEY, MIN_SECRET_LENGTH, GatewaySettings, MaintenanceSettings, RecallSettings

ROOT = Path(__file__).resolve().parents[2]
STRONG = "k3Zq9vQn2Lr8Tt4Wm6Yp1Hs5Jd7Fg0Bx-strong"  # 40 characters
GOOD = {
    "ENGRAM_ENV": "production",
    "MEMENTO_ACCESS_KEY": STRONG + "-master",
    "ENGRAM_SERVICE_TOKEN": STRONG + "-service",
    "ARTIFACT_TOKEN_SECRET": STRONG + "-artifact",
    "DATABASE_URL": "postgresql://engram:pw@db.internal:5432/engram",
}
WEAK = {
    "empty": "",
    "dev master key": DEV_MASTER_KEY,
    "dev service token": "engram-dev-service-token",
    "dev artifact secret": "engram-dev-artifact-token-secret",
    "compose default token": "compose-internal-service-token",
    "manifest placeholder": "REPLACE_ME-master-key",
    "placeholder in a long value": "replace_me-with-something-long-enough-to-pass-the-length",
    "short": "s3cr3t-but-only-31-characters-x"[:MIN_SECRET_LENGTH - 1],
}


def gateway(**env: str) -> GatewaySettings:
    return GatewaySettings(**(GOOD | env))  # type: ignore[arg-type]


def test_production_accepts_long_random_secrets() -> None:
    gateway().check_secure()
    RecallSettings(**GOOD).check_secure()  # type: ignore[arg-type]
    MaintenanceSettings(**GOOD).check_secure()  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", ["MEMENTO_ACCESS_KEY", "ENGRAM_SERVICE_TOKEN", "ARTIFACT_TOKEN_SECRET"])
@pytest.mark.parametrize("kind", sorted(WEAK))
def test_gateway_refuses_a_weak_secret(setting: str, kind: str) -> None:
    value = WEAK[kind]
    with pytest.raises(ValueError, match=setting) as refused:
        gateway(**{setting: value}).check_secure()
    if value:
        assert value not in str(refused.value)  # the message names the setting, never the secret


@pytest.mark.parametrize("cls", [RecallSettings, MaintenanceSettings])
@pytest.mark.parametrize("kind", sorted(WEAK))
def test_services_refuse_a_weak_service_token(cls: type[RecallSettings], kind: str) -> None:
    with pytest.raises(ValueError, match="ENGRAM_SERVICE_TOKEN"):
        cls(**(GOOD | {"ENGRAM_SERVICE_TOKEN": WEAK[kind]})).check_secure()  # type: ignore[arg-type]


def test_a_placeholder_database_password_is_refused() -> None:
    url = "postgresql://engram:REPLACE_ME-password@postgres:5432/engram"
    with pytest.raises(ValueError, match="DATABASE_URL"):
        RecallSettings(**(GOOD | {"DATABASE_URL": url})).check_secure()  # type: ignore[arg-type]


def test_dev_and_test_keep_their_defaults() -> None:
    for env in ("dev", "test"):
        GatewaySettings(ENGRAM_ENV=env).check_secure()  # type: ignore[call-arg]
        MaintenanceSettings(ENGRAM_ENV=env).check_secure()  # type: ignore[call-arg]


PROCESSES = {
    "gateway": ["-m", "uvicorn", "services.gateway.app:create_app", "--factory", "--port", "0"],
    "recall": ["-m", "uvicorn", "services.recall.app:create_app", "--factory", "--port", "0"],
    "ingest": ["-m", "uvicorn", "services.ingest.app:create_app", "--factory", "--port", "0"],
    "worker": ["-m", "celery", "-A", "services.maintenance.celery_app:app", "worker", "--pool", "solo"],
    "beat": ["-m", "celery", "-A", "services.maintenance.celery_app:app", "beat", "-s", "/tmp/engram-never-written"],
}


@pytest.mark.parametrize("name", sorted(PROCESSES))
def test_a_service_process_with_the_shipped_placeholder_exits_non_zero(name: str) -> None:
    """Started as the manifests would start it, before replacing REPLACE_ME: it exits at once,
    naming the setting (nothing listens, nothing connects: the check runs before the lifespan)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "MEMENTO_", "ARTIFACT_"))}
    env |= GOOD | {"ENGRAM_SERVICE_TOKEN": "REPLACE_ME-service-token", "REDIS_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run(
        [sys.executable, *PROCESSES[name]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode != 0
    assert "ENGRAM_SERVICE_TOKEN is a placeholder" in result.stdout + result.stderr


def test_the_same_process_starts_past_the_check_with_real_secrets() -> None:
    """Guards the test above: with real values the gateway's factory builds the app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "MEMENTO_", "ARTIFACT_"))} | GOOD
    code = "from services.gateway.app import create_app; create_app(); print('built')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "built" in result.stdout
