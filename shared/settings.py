"""Typed settings. Env names follow the reference (memento-mcp) so existing config works."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_MASTER_KEY = "engram-dev-master-key"


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    environment: Literal["dev", "test", "production"] = Field("dev", alias="ENGRAM_ENV")
    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/engram", alias="DATABASE_URL")
    db_pool_min: int = Field(1, alias="DB_POOL_MIN")
    db_pool_max: int = Field(10, alias="DB_POOL_MAX")
    redis_enabled: bool = Field(True, alias="REDIS_ENABLED")
    redis_url: str = Field("redis://127.0.0.1:6379/0", alias="REDIS_URL")
    # Shared secret between gateway and the internal services; recall and ingest refuse
    # any caller without it.
    service_token: str = Field("engram-dev-service-token", alias="ENGRAM_SERVICE_TOKEN")
    log_level: str = Field("INFO", alias="LOG_LEVEL")
    otel_service_name: str | None = Field(None, alias="OTEL_SERVICE_NAME")
    otel_console: bool = Field(False, alias="ENGRAM_OTEL_CONSOLE")

    @property
    def redis_active(self) -> bool:
        return self.redis_enabled and bool(self.redis_url)


class EmbeddingSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    # "onnx" serves an ONNX export of the model (made once from the torch model, offline);
    # "torch" runs sentence-transformers directly.
    backend: Literal["onnx", "torch"] = Field("onnx", alias="EMBEDDING_BACKEND")
    model_path: str | None = Field(None, alias="EMBEDDING_MODEL_PATH")
    cache_dir: str = Field(".data/models", alias="EMBEDDING_CACHE_DIR")
    dimensions: int = Field(384, alias="EMBEDDING_DIMENSIONS")
    batch_size: int = Field(64, alias="EMBEDDING_BATCH_SIZE")
    threads: int = Field(0, alias="EMBEDDING_THREADS")


class GatewaySettings(CommonSettings):
    port: int = Field(57332, alias="PORT")
    host: str = Field("127.0.0.1", alias="HOST")
    access_key: str = Field("", alias="MEMENTO_ACCESS_KEY")
    recall_url: str = Field("http://127.0.0.1:57333", alias="RECALL_URL")
    ingest_url: str = Field("http://127.0.0.1:57334", alias="INGEST_URL")
    upstream_timeout: timedelta = Field(timedelta(seconds=30), alias="UPSTREAM_TIMEOUT")
    allowed_hosts: list[str] = Field(default_factory=list, alias="MCP_ALLOWED_HOSTS")
    allowed_origins: list[str] = Field(default_factory=list, alias="ALLOWED_ORIGINS")
    max_body_bytes: int = Field(1024 * 1024, alias="MAX_BODY_BYTES")
    enable_openapi: bool = Field(False, alias="ENABLE_OPENAPI")

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def check_secure(self) -> None:
        """Refuse a missing or default master key outside dev."""
        if self.environment == "production" and self.access_key in ("", DEV_MASTER_KEY):
            raise ValueError("MEMENTO_ACCESS_KEY must be set to a secret value in production")


class RecallSettings(CommonSettings):
    port: int = Field(57333, alias="PORT")
    hnsw_ef_search: int = Field(80, alias="HNSW_EF_SEARCH")
    l1_cache_ttl: timedelta = Field(timedelta(seconds=60), alias="L1_CACHE_TTL")


class IngestSettings(CommonSettings):
    port: int = Field(57334, alias="PORT")
    broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")


class MaintenanceSettings(CommonSettings):
    broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")
    consolidate_interval: timedelta = Field(timedelta(hours=6), alias="CONSOLIDATE_INTERVAL")
    link_sweep_interval: timedelta = Field(timedelta(minutes=5), alias="LINK_SWEEP_INTERVAL")


@lru_cache(maxsize=1)
def embedding_settings() -> EmbeddingSettings:
    return EmbeddingSettings()
