"""What the deploy files may set in a container's environment, and how to check the values.

Env names are the aliases of the settings classes in shared/settings.py plus a few read by
libraries or the interpreter; values are checked by building the settings class that the
container's command runs, from the environment, as the process would.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
from pydantic_settings import BaseSettings

from shared import settings as settings_module

# Read outside shared/settings.py: huggingface_hub and transformers (never reach a hub),
# and the interpreter.
INFRA_ENV = frozenset({"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})


def settings_classes() -> list[type[BaseSettings]]:
    return [
        cls
        for _, cls in inspect.getmembers(settings_module, inspect.isclass)
        if issubclass(cls, BaseSettings) and cls is not BaseSettings and cls.__module__ == settings_module.__name__
    ]


def settings_aliases() -> frozenset[str]:
    return frozenset(
        field.alias.upper() for cls in settings_classes() for field in cls.model_fields.values() if field.alias
    )


def settings_for_command(command: list[str]) -> type[BaseSettings]:
    """The settings class the process started by `command` builds."""
    line = " ".join(command)
    for marker, cls in (
        ("services.gateway.app", settings_module.GatewaySettings),
        ("services.recall.app", settings_module.RecallSettings),
        ("services.ingest.app", settings_module.IngestSettings),
        ("services.maintenance.celery_app", settings_module.MaintenanceSettings),
        ("shared.schema.migrate", settings_module.CommonSettings),
        ("wait_for_schema.py", settings_module.CommonSettings),
    ):
        if marker in line:
            return cls
    raise AssertionError(f"no settings class known for command {command}")


@contextmanager
def process_environment(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> Iterator[None]:
    """Exactly `env` for every settings alias, as a fresh process would see it."""
    with monkeypatch.context() as patch:
        for name in settings_aliases() | INFRA_ENV:
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        yield


def build_settings(monkeypatch: pytest.MonkeyPatch, command: list[str], env: Mapping[str, str]) -> BaseSettings:
    """Build the process's settings (and the embedding settings) from `env`; raise if invalid."""
    cls = settings_for_command(command)
    with process_environment(monkeypatch, env):
        built = cls()
        settings_module.EmbeddingSettings()
    # The services check their secrets at start-up; the migration and wait-for-schema hold none
    # but DATABASE_URL.
    if cls is not settings_module.CommonSettings:
        built.check_secure()  # type: ignore[attr-defined]
    return built
