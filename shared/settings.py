"""Typed settings. Env names follow the reference (memento-mcp) so existing config works."""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEV_MASTER_KEY = "engram-dev-master-key"
# Under ENGRAM_ENV=production a secret must be at least this long (`openssl rand -base64 32`
# gives 44 characters) and none of the values the repository ships: the code's dev defaults,
# docker-compose.yml's old default service token, the manifests' REPLACE_ME placeholders.
MIN_SECRET_LENGTH = 32
SHIPPED_SECRETS = frozenset({
    DEV_MASTER_KEY, "engram-dev-service-token", "engram-dev-artifact-token-secret", "compose-internal-service-token",
})


def refuse_weak_secret(name: str, value: str) -> None:
    """ValueError naming the setting (never its value) when `value` is not fit for production."""
    if not value:
        raise ValueError(f"{name} must be set to a secret value in production")
    if "REPLACE_ME" in value.upper() or value in SHIPPED_SECRETS:
        raise ValueError(f"{name} is a placeholder or a development default; set a secret value in production")
    if len(value) < MIN_SECRET_LENGTH:
        raise ValueError(f"{name} must be at least {MIN_SECRET_LENGTH} characters in production")


def seconds_or_duration(value: object) -> object:
    """A bare number is seconds (as the reference's config writes them); else ISO 8601."""
    if isinstance(value, str) and value.replace(".", "", 1).isdigit():
        return timedelta(seconds=float(value))
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    return value


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", case_sensitive=False)

    environment: Literal["dev", "test", "production"] = Field("dev", alias="ENGRAM_ENV")
    # How wide each step of an HNSW walk looks (recall's vector layer, link discovery on write
    # and in maintenance): every pool that walks the graph starts its connections with it
    # (vector_search.graph_settings).
    hnsw_ef_search: int = Field(80, alias="HNSW_EF_SEARCH")
    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/engram", alias="DATABASE_URL")
    db_pool_min: int = Field(1, alias="DB_POOL_MIN")
    db_pool_max: int = Field(10, alias="DB_POOL_MAX")
    redis_enabled: bool = Field(True, alias="REDIS_ENABLED")
    redis_url: str = Field("redis://127.0.0.1:6379/0", alias="REDIS_URL")
    # Shared secret between gateway and the internal services; recall and ingest refuse
    # any caller without it.
    service_token: str = Field("engram-dev-service-token", alias="ENGRAM_SERVICE_TOKEN")
    log_level: str = Field("INFO", alias="LOG_LEVEL")
    # Unset: JSON under ENGRAM_ENV=production, text elsewhere (make run, tests).
    log_format: Literal["text", "json"] | None = Field(None, alias="LOG_FORMAT")
    otel_service_name: str | None = Field(None, alias="OTEL_SERVICE_NAME")
    otel_console: bool = Field(False, alias="ENGRAM_OTEL_CONSOLE")
    # The standard OpenTelemetry variables that decide whether traces leave the process
    # (shared/telemetry.py); the exporter reads the others (headers, timeout, ...) itself.
    otel_sdk_disabled: bool = Field(False, alias="OTEL_SDK_DISABLED")
    otel_traces_exporter: str = Field("", alias="OTEL_TRACES_EXPORTER")
    otel_exporter_otlp_endpoint: str = Field("", alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    otel_exporter_otlp_traces_endpoint: str = Field("", alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    # seed 003: secrets are never stored; "reject" refuses the write (-32602 naming the kind),
    # "redact" stores the text with each secret replaced by [REDACTED:<kind>]. Common: ingest
    # screens every write tool, recall screens tool_feedback's free text.
    secret_policy: Literal["reject", "redact"] = Field("reject", alias="ENGRAM_SECRET_POLICY")
    # Connect and command timeout of the request-path Redis clients (cache, batch queue,
    # effects, the Celery producer). A loopback or LAN Redis answers in well under 1 ms; this
    # only bounds what a hung or unreachable one costs before the breaker opens.
    redis_timeout: timedelta = Field(timedelta(milliseconds=250), alias="REDIS_TIMEOUT")
    # After a Redis failure the request path skips Redis this long (one probe then tries again).
    redis_breaker_cooldown: timedelta = Field(timedelta(seconds=5), alias="REDIS_BREAKER_COOLDOWN")
    # Artifacts (reference 004): bytes outside Postgres rows, in ARTIFACTS_DIR on local disk, or
    # in an S3-compatible store once ARTIFACTS_S3_BUCKET is set (shared/artifacts/). Read by
    # ingest (writes, purge) and recall (reads); the gateway only checks the size early.
    artifacts_dir: str = Field(".data/artifacts", alias="ARTIFACTS_DIR")
    artifacts_s3_bucket: str | None = Field(None, alias="ARTIFACTS_S3_BUCKET")
    artifacts_s3_endpoint: str | None = Field(None, alias="ARTIFACTS_S3_ENDPOINT")
    artifacts_s3_region: str = Field("us-east-1", alias="ARTIFACTS_S3_REGION")
    artifacts_s3_access_key: str | None = Field(None, alias="ARTIFACTS_S3_ACCESS_KEY")
    artifacts_s3_secret_key: str | None = Field(None, alias="ARTIFACTS_S3_SECRET_KEY")
    # Decoded bytes per artifact. 512 KiB keeps a binary artifact's base64 JSON body (4/3 of it)
    # inside the gateway's default MAX_BODY_BYTES (1 MiB); raise both together.
    artifact_max_bytes: int = Field(512 * 1024, alias="ARTIFACT_MAX_BYTES", ge=1)

    # memory:* events (reference 001, shared/memory_events.py): one Redis stream every write
    # path publishes to and every gateway replica reads, bounded by count (XADD MAXLEN ~) and
    # by age (XTRIM MINID ~). ~150 bytes an event: the default count is ~15 MB of Redis.
    memory_events_stream: str = Field("engram:memory:events", alias="ENGRAM_MEMORY_EVENTS_STREAM")
    memory_events_maxlen: int = Field(100_000, alias="ENGRAM_MEMORY_EVENTS_MAXLEN", ge=1)
    memory_events_retention: timedelta = Field(timedelta(hours=24), alias="ENGRAM_MEMORY_EVENTS_RETENTION")

    @field_validator("redis_timeout", "redis_breaker_cooldown", "memory_events_retention", mode="before")
    @classmethod
    def _redis_seconds(cls, value: object) -> object:
        return seconds_or_duration(value)

    @property
    def redis_active(self) -> bool:
        return self.redis_enabled and bool(self.redis_url)

    def check_secure(self) -> None:
        """Under ENGRAM_ENV=production, refuse the secrets every process holds when they are
        missing, shipped defaults or placeholders, or short (each service calls it at start-up)."""
        if self.environment != "production":
            return
        refuse_weak_secret("ENGRAM_SERVICE_TOKEN", self.service_token)
        if "REPLACE_ME" in self.database_url.upper():
            raise ValueError("DATABASE_URL still holds a REPLACE_ME placeholder")

    @property
    def effective_log_format(self) -> Literal["text", "json"]:
        return self.log_format or ("json" if self.environment == "production" else "text")

    @property
    def otel_exporters(self) -> frozenset[str]:
        return frozenset(part.strip().lower() for part in self.otel_traces_exporter.split(",") if part.strip())

    @property
    def otlp_traces(self) -> bool:
        """OTLP export: asked for by name, or implied by an endpoint; "none" turns it off.
        (The spec's default exporter is otlp; without an endpoint here it stays off, so a
        dev stack does not retry a collector that is not there.)"""
        if "none" in self.otel_exporters:
            return False
        return "otlp" in self.otel_exporters or bool(self.otel_exporter_otlp_endpoint or self.otel_exporter_otlp_traces_endpoint)


class EmbeddingSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    # "onnx" serves an ONNX export of the model (made once from the torch model, offline);
    # "torch" runs sentence-transformers directly; "onnx-int8" a dynamic int8 quantization
    # of the export (faster, vectors differ from fp32's); "openvino" the export compiled by
    # OpenVINO, bfloat16 where the CPU has it natively; "auto" (default) is "openvino" where
    # the CPU multiplies bfloat16 natively (AMX / AVX512-BF16), else "onnx"
    # (shared/embeddings/model.py).
    backend: Literal["auto", "onnx", "onnx-int8", "openvino", "torch"] = Field("auto", alias="EMBEDDING_BACKEND")
    model_path: str | None = Field(None, alias="EMBEDDING_MODEL_PATH")
    # SHA-256 of an own model's files (EMBEDDING_MODEL_PATH): its ONNX export (or, for torch,
    # model.safetensors) and tokenizer.json. Unset, the bundled model's pins in
    # shared/embeddings/model.py apply; a file that differs is refused at load.
    model_sha256: str | None = Field(None, alias="EMBEDDING_MODEL_SHA256")
    tokenizer_sha256: str | None = Field(None, alias="EMBEDDING_TOKENIZER_SHA256")
    cache_dir: str = Field(".data/models", alias="EMBEDDING_CACHE_DIR")
    dimensions: int = Field(384, alias="EMBEDDING_DIMENSIONS")
    # Texts per model run (length-sorted first); unset, each backend's measured best
    # (shared/embeddings/model.py: DEFAULT_BATCH).
    batch_size: int | None = Field(None, alias="EMBEDDING_BATCH_SIZE", ge=1)
    threads: int = Field(0, alias="EMBEDDING_THREADS")


class GatewaySettings(CommonSettings):
    port: int = Field(57332, alias="PORT")
    host: str = Field("127.0.0.1", alias="HOST")
    access_key: str = Field("", alias="MEMENTO_ACCESS_KEY")
    recall_url: str = Field("http://127.0.0.1:57333", alias="RECALL_URL")
    ingest_url: str = Field("http://127.0.0.1:57334", alias="INGEST_URL")
    upstream_timeout: timedelta = Field(timedelta(seconds=30), alias="UPSTREAM_TIMEOUT")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="MCP_ALLOWED_HOSTS")
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="ALLOWED_ORIGINS")
    max_body_bytes: int = Field(1024 * 1024, alias="MAX_BODY_BYTES")
    enable_openapi: bool = Field(False, alias="ENABLE_OPENAPI")
    # The folder the services' log files are in (seed: LOG_DIR), read by the admin /logs routes;
    # unset (or empty): the deployment logs to stdout only and those routes say so.
    log_dir: str | None = Field(None, alias="LOG_DIR")
    # Celery broker for the session hooks (auto reflect); defaults to REDIS_URL.
    broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")
    # seed: session segments ({transportId}#{seq}) rotate on idle / lifetime; on by default.
    session_segment: bool = Field(True, alias="MEMENTO_SESSION_SEGMENT")
    segment_idle: timedelta = Field(timedelta(minutes=30), alias="MEMENTO_SESSION_SEGMENT_IDLE")
    segment_lifetime: timedelta = Field(timedelta(hours=4), alias="MEMENTO_SESSION_SEGMENT_LIFETIME")
    # Streamable HTTP sessions with no request for this long are closed (and reflected).
    session_idle_timeout: timedelta = Field(timedelta(minutes=30), alias="MEMENTO_SESSION_IDLE_TIMEOUT")
    # Where the other gateway replicas reach this one (a legacy SSE POST /message that lands
    # on a replica without the stream is forwarded to its holder): the pod IP in Kubernetes.
    internal_host: str | None = Field(None, alias="GATEWAY_INTERNAL_HOST")
    # seed: POST /session/rotate is limited per IP, 5 per minute by default.
    rotate_rate_limit_per_min: int = Field(5, alias="MEMENTO_ROTATE_RATE_LIMIT_PER_MIN")
    # Requests per minute: per client IP before authentication, per key after it.
    ip_rate_limit_per_min: int = Field(600, alias="RATE_LIMIT_PER_IP_PER_MIN")
    key_rate_limit_per_min: int = Field(1200, alias="RATE_LIMIT_PER_KEY_PER_MIN")
    # OAuth redirect URIs on one of these origins are admitted: same scheme and host, and the
    # port when the entry names one, any path (localhost only by default: RFC 8252 loopback
    # clients pick their port at run time). Hosted clients' callbacks are in
    # OAUTH_REDIRECT_EXACT_URIS, matched exactly.
    oauth_redirect_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://localhost", "http://127.0.0.1", "http://[::1]"],
        alias="OAUTH_REDIRECT_ALLOWLIST",
    )
    # Redirect URIs admitted only by full-URI equality (no prefix, no wildcard, no
    # normalisation: `.../auth_callback/../x` and `.../auth_callbackX` are refused). The default
    # is the hosted-client callback the reference documents for `POST /register` (claude.ai);
    # an operator adds others here, or sets it empty to admit none.
    oauth_redirect_exact_uris: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["https://claude.ai/api/mcp/auth_callback"],
        alias="OAUTH_REDIRECT_EXACT_URIS",
    )
    # Wrong keys accepted at the consent form (POST /authorize) per client IP per minute;
    # past it the form answers 429 until the minute ends, whatever key is typed.
    oauth_consent_failures_per_min: int = Field(10, alias="OAUTH_CONSENT_FAILURES_PER_MIN")
    oauth_code_ttl: timedelta = Field(timedelta(minutes=5), alias="OAUTH_CODE_TTL")
    oauth_token_ttl: timedelta = Field(timedelta(hours=24), alias="OAUTH_TOKEN_TTL")
    # GET /api/v1/memory/events and /ws: a keep-alive (and, on SSE, the stream's position past
    # events the subscriber's filters skipped) this often; the key is re-checked as often, so a
    # key set inactive or deleted ends its streams within this time.
    memory_events_keepalive: timedelta = Field(timedelta(seconds=15), alias="ENGRAM_MEMORY_EVENTS_KEEPALIVE")
    # Artifact download tokens (reference 004, mnemory's names): HS256-signed with this secret,
    # DOWNLOAD_TOKEN_TTL seconds by default, a client's ttl capped at DOWNLOAD_TOKEN_MAX_TTL.
    # The dev default is refused in production (check_secure).
    artifact_token_secret: str = Field("engram-dev-artifact-token-secret", alias="ARTIFACT_TOKEN_SECRET")
    download_token_ttl: int = Field(3600, alias="DOWNLOAD_TOKEN_TTL", ge=1)
    download_token_max_ttl: int = Field(86400, alias="DOWNLOAD_TOKEN_MAX_TTL", ge=1)
    # Prefix of the download URLs the token endpoint returns; unset, they are relative paths.
    server_base_url: str | None = Field(None, alias="SERVER_BASE_URL")

    @field_validator("memory_events_keepalive", mode="before")
    @classmethod
    def _keepalive_seconds(cls, value: object) -> object:
        return seconds_or_duration(value)

    @field_validator("allowed_hosts", "allowed_origins", "oauth_redirect_allowlist", "oauth_redirect_exact_uris", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def internal_url(self) -> str:
        host = self.internal_host or ("127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host)  # noqa: S104 - compared, not bound
        return f"http://{host}:{self.port}"

    def check_secure(self) -> None:
        """Refuse a missing, default, placeholder or short master key (and the other secrets) in production."""
        super().check_secure()
        if self.environment == "production":
            refuse_weak_secret("MEMENTO_ACCESS_KEY", self.access_key)
            refuse_weak_secret("ARTIFACT_TOKEN_SECRET", self.artifact_token_secret)


class RecallSettings(CommonSettings):
    port: int = Field(57333, alias="PORT")
    l1_cache_ttl: timedelta = Field(timedelta(seconds=60), alias="L1_CACHE_TTL")
    symbolic_explain: bool = Field(False, alias="MEMENTO_SYMBOLIC_EXPLAIN")
    spreading_activation: bool = Field(False, alias="ENABLE_SPREADING_ACTIVATION")
    # Read replicas (shared/read_routing.py): Postgres streaming standbys recall reads from,
    # comma-separated URLs; empty, every read goes to DATABASE_URL. A standby is skipped while
    # it is unreachable or more than DATABASE_REPLICA_MAX_LAG behind the primary (checked every
    # DATABASE_REPLICA_CHECK_INTERVAL); a caller's read waits up to DATABASE_REPLICA_READ_WAIT
    # for a standby to replay that caller's last write, then goes to the primary. The lag bound
    # stays under the write positions' Redis TTL (read_routing.WRITE_POSITION_TTL_S, 300 s).
    database_replica_urls: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="DATABASE_REPLICA_URLS")
    database_replica_strategy: Literal["round_robin", "least_lag"] = Field("round_robin", alias="DATABASE_REPLICA_STRATEGY")
    database_replica_max_lag: timedelta = Field(
        timedelta(seconds=5), alias="DATABASE_REPLICA_MAX_LAG", gt=timedelta(0), le=timedelta(seconds=120),
    )
    database_replica_read_wait: timedelta = Field(
        timedelta(milliseconds=250), alias="DATABASE_REPLICA_READ_WAIT", ge=timedelta(0), le=timedelta(seconds=30),
    )
    database_replica_check_interval: timedelta = Field(
        timedelta(seconds=1), alias="DATABASE_REPLICA_CHECK_INTERVAL", gt=timedelta(0), le=timedelta(seconds=10),
    )

    @field_validator("database_replica_urls", mode="before")
    @classmethod
    def _replica_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("database_replica_max_lag", "database_replica_read_wait", "database_replica_check_interval", mode="before")
    @classmethod
    def _replica_seconds(cls, value: object) -> object:
        return seconds_or_duration(value)

    def check_secure(self) -> None:
        super().check_secure()
        if self.environment == "production" and any("REPLACE_ME" in url.upper() for url in self.database_replica_urls):
            raise ValueError("DATABASE_REPLICA_URLS still holds a REPLACE_ME placeholder")


class IngestSettings(CommonSettings):
    port: int = Field(57334, alias="PORT")
    broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")
    # seed: the PolicyRules soft gate (validation_warnings); hard gate per key.
    symbolic_policy_rules: bool = Field(False, alias="MEMENTO_SYMBOLIC_POLICY_RULES")
    workspace_gate: bool = Field(False, alias="MEMENTO_WORKSPACE_GATE")
    # seed: true -> remember re-checks the quota under SELECT api_keys FOR UPDATE in the
    # insert's transaction (no overshoot under concurrency); false (default) -> checked
    # before the write, without the lock. batch_remember always takes the lock.
    remember_atomic: bool = Field(False, alias="MEMENTO_REMEMBER_ATOMIC")
    case_backprop_enabled: bool = Field(False, alias="MEMENTO_CASE_BACKPROP_ENABLED")
    # seed: feedback_sampled hints on remember / amend / forget; default true. Unset, it is
    # off under ENGRAM_ENV=test so exact-reply assertions elsewhere stay deterministic.
    feedback_sampling: bool | None = Field(None, alias="MEMENTO_FEEDBACK_SAMPLING")
    # seed config feedback.sampling: per-tool probability, 2 hints per session, 900 s apart.
    feedback_rate_remember: float = Field(0.10, alias="MEMENTO_FEEDBACK_RATE_REMEMBER", ge=0, le=1)
    feedback_rate_amend: float = Field(0.25, alias="MEMENTO_FEEDBACK_RATE_AMEND", ge=0, le=1)
    feedback_rate_forget: float = Field(0.25, alias="MEMENTO_FEEDBACK_RATE_FORGET", ge=0, le=1)
    feedback_max_per_session: int = Field(2, alias="MEMENTO_FEEDBACK_MAX_PER_SESSION")
    feedback_cooldown: timedelta = Field(timedelta(seconds=900), alias="MEMENTO_FEEDBACK_COOLDOWN")
    # The job outbox relay (shared/job_relay.py): an idle look for rows left by other
    # replicas, and the longest wait between two tries while the broker is down.
    outbox_poll_interval: timedelta = Field(timedelta(seconds=2), alias="ENGRAM_OUTBOX_POLL_INTERVAL")
    outbox_backoff_max: timedelta = Field(timedelta(seconds=30), alias="ENGRAM_OUTBOX_BACKOFF_MAX")
    # How long a relay woken by a commit waits before its claim, so the jobs of the writes
    # meanwhile are sent together (a run of single remembers: one link job, not one each).
    outbox_linger: timedelta = Field(timedelta(milliseconds=250), alias="ENGRAM_OUTBOX_LINGER")
    # reference 001 GET /memory/consolidation/status: how often the LLM consolidation pass is
    # due (`intervalHours`, `due`); a bare number is hours.
    memory_consolidation_interval: timedelta = Field(timedelta(hours=24), alias="MEMORY_CONSOLIDATION_INTERVAL_HOURS")

    @field_validator("memory_consolidation_interval", mode="before")
    @classmethod
    def _hours(cls, value: object) -> object:
        if isinstance(value, (int, float)) or (isinstance(value, str) and value.replace(".", "", 1).isdigit()):
            return timedelta(hours=float(value))
        return value

    @field_validator("feedback_cooldown", "outbox_poll_interval", "outbox_backoff_max", "outbox_linger", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return seconds_or_duration(value)

    @property
    def feedback_sampling_on(self) -> bool:
        if self.feedback_sampling is not None:
            return self.feedback_sampling
        return self.environment != "test"


class MaintenanceSettings(CommonSettings):
    broker_url: str | None = Field(None, alias="CELERY_BROKER_URL")
    consolidate_enabled: bool = Field(True, alias="CONSOLIDATE_ENABLED")
    consolidate_interval: timedelta = Field(timedelta(hours=6), alias="CONSOLIDATE_INTERVAL")
    # Stage names (see services/maintenance/pipeline.py) switched off, comma-separated.
    consolidate_disabled_stages: str = Field("", alias="CONSOLIDATE_DISABLED_STAGES")
    link_sweep_interval: timedelta = Field(timedelta(minutes=5), alias="LINK_SWEEP_INTERVAL")
    reflect_sweep_interval: timedelta = Field(timedelta(minutes=5), alias="REFLECT_SWEEP_INTERVAL")
    embedding_backfill_interval: timedelta = Field(timedelta(minutes=10), alias="EMBEDDING_BACKFILL_INTERVAL")
    # Beat's drain of the job outbox, for rows whose ingest process died before relaying them.
    outbox_relay_interval: timedelta = Field(timedelta(seconds=30), alias="ENGRAM_OUTBOX_RELAY_INTERVAL")
    # VACUUM of fragments, which recall reads index-only (shared.repositories.maintenance.
    # vacuum_for_visibility): recall's own row updates clear the visibility map without ever
    # reaching autovacuum's dead-tuple threshold. 0 = off.
    visibility_vacuum_interval: timedelta = Field(timedelta(minutes=10), alias="VISIBILITY_VACUUM_INTERVAL")
    # A fragment type's own HNSW graph is built (concurrently) once the type has this many rows
    # (shared.repositories.type_graphs; migration 0032 drops smaller types' graphs). The check
    # runs every type_graph_interval; 0 = off (the worker builds none).
    type_graph_min_rows: int = Field(100_000, alias="TYPE_GRAPH_MIN_ROWS", ge=1)
    type_graph_interval: timedelta = Field(timedelta(minutes=10), alias="TYPE_GRAPH_INTERVAL")
    # The k-means cells index (shared.repositories.vector_cells) is trained and built
    # (concurrently) once fragments has this many rows; large filtered scopes are then ranked
    # from their query's nearest cells. Checked every vector_cells_interval; 0 = off.
    vector_cells_min_rows: int = Field(200_000, alias="VECTOR_CELLS_MIN_ROWS", ge=1)
    vector_cells_interval: timedelta = Field(timedelta(minutes=10), alias="VECTOR_CELLS_INTERVAL")
    # ...and trained again, a new version built beside the current one, once fragments has this
    # many times the rows the current version was trained at (the old one is retired a run
    # later). 0 = never; otherwise more than 1.
    vector_cells_retrain_growth: float = Field(2.0, alias="VECTOR_CELLS_RETRAIN_GROWTH", ge=0)
    # An open session idle this long is ended ("expired") and reflected by the sweep.
    session_idle_ttl: timedelta = Field(timedelta(hours=24), alias="SESSION_IDLE_TTL")
    # mnemory: FSCK_AUTO_INTERVAL hours, 0 = off; thresholds for what auto-fsck applies.
    fsck_auto_interval: timedelta = Field(timedelta(hours=24), alias="FSCK_AUTO_INTERVAL")
    fsck_auto_min_confidence: float = Field(0.95, alias="FSCK_AUTO_MIN_CONFIDENCE", ge=0, le=1)
    fsck_auto_min_severity: Literal["low", "medium", "high"] = Field("medium", alias="FSCK_AUTO_MIN_SEVERITY")
    # Prometheus endpoint of the worker (all pool processes, multiprocess mode); 0 = off.
    worker_metrics_port: int = Field(9540, alias="WORKER_METRICS_PORT")
    ingest_url: str = Field("http://127.0.0.1:57334", alias="INGEST_URL")

    @property
    def disabled_stages(self) -> frozenset[str]:
        return frozenset(part.strip() for part in self.consolidate_disabled_stages.split(",") if part.strip())

    @field_validator("vector_cells_retrain_growth")
    @classmethod
    def _growth(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError("VECTOR_CELLS_RETRAIN_GROWTH is 0 (never) or more than 1")
        return value

    @field_validator("consolidate_interval", "fsck_auto_interval", mode="before")
    @classmethod
    def _hours(cls, value: object) -> object:
        """A bare number is hours (the reference's CONSOLIDATE_INTERVAL / FSCK_AUTO_INTERVAL)."""
        if isinstance(value, (int, float)) or (isinstance(value, str) and value.replace(".", "", 1).isdigit()):
            return timedelta(hours=float(value))
        return value


class BatchWorkerSettings(CommonSettings):
    """The batch_remember queue's consumer (services/maintenance/batch_worker.py)."""

    ingest_url: str = Field(
        "http://127.0.0.1:57334", validation_alias=AliasChoices("ENGRAM_BATCH_INGEST_URL", "INGEST_URL")
    )
    # A job held longer than this without progress is taken to belong to a dead consumer.
    # One chunk takes ~0.3 s to store here (50 fragments with embeddings), so a minute is
    # generous even on a loaded machine.
    lease: timedelta = Field(timedelta(seconds=60), alias="ENGRAM_BATCH_LEASE")
    recover_interval: timedelta = Field(timedelta(seconds=30), alias="ENGRAM_BATCH_RECOVER_INTERVAL")
    # Fragments per ingest call: progress is committed (and survives a crash) per chunk.
    chunk: int = Field(50, alias="ENGRAM_BATCH_CHUNK", ge=1, le=200)
    # Jobs per task run before the run re-enqueues itself (bounded runs, STYLE 7).
    jobs_per_run: int = Field(20, alias="ENGRAM_BATCH_JOBS_PER_RUN", ge=1)

    @field_validator("lease", "recover_interval", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return seconds_or_duration(value)


@lru_cache(maxsize=1)
def embedding_settings() -> EmbeddingSettings:
    return EmbeddingSettings()


# seed: "40000ms 이상으로 변경하지 않는다" (never raise it to 40 s or more).
MAX_TIMEOUT_MS = 40_000


class LLMSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    base_url: str | None = Field(None, alias="LLM_BASE_URL")
    api_key: str | None = Field(None, alias="LLM_API_KEY")
    model: str | None = Field(None, alias="LLM_MODEL")
    timeout_ms: int = Field(30_000, alias="GEMINI_TIMEOUT_MS", gt=0)
    # Calls one maintenance run (a cycle, an fsck, one AutoReflect) may make.
    max_calls_per_run: int = Field(20, alias="LLM_MAX_CALLS_PER_RUN", ge=0)

    @field_validator("timeout_ms")
    @classmethod
    def _cap(cls, value: int) -> int:
        if value >= MAX_TIMEOUT_MS:
            logging.getLogger(__name__).warning("GEMINI_TIMEOUT_MS=%s capped below %s ms", value, MAX_TIMEOUT_MS)
            return MAX_TIMEOUT_MS - 1_000
        return value

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)


class MnemorySettings(BaseSettings):
    """The mnemory REST surface (reference 004; services/gateway/mnemory_api/): env names are
    the reference's. Read by the gateway (auth, memory sessions, rate limit), recall (score
    threshold) and the worker (/api/remember's job)."""

    model_config = SettingsConfigDict(extra="ignore")

    # ES256 JWTs with aud=mnemory: a PEM public key file, or a JWKS URL (one of them).
    jwt_public_key: str = Field("", alias="MNEMORY_JWT_PUBLIC_KEY")
    jwks_url: str = Field("", alias="MNEMORY_JWKS_URL")
    jwt_issuer: str = Field("cognis", alias="MNEMORY_JWT_ISSUER")
    # The claim whose value is the Engram API key id a token acts as (README).
    jwt_key_claim: str = Field("sub", alias="MNEMORY_JWT_KEY_CLAIM")
    # Idle lifetime of a /api/recall memory session (seconds or ISO 8601), prolonged by use.
    memory_session_ttl: timedelta = Field(timedelta(hours=24), alias="MEMORY_SESSION_TTL")
    # redis (default when REDIS_URL is set) or memory (one gateway process only).
    session_backend: Literal["redis", "memory"] | None = Field(None, alias="SESSION_BACKEND")
    # /api/remember calls per key per minute; 0 = no limit.
    remember_rate_limit: int = Field(10, alias="REMEMBER_RATE_LIMIT", ge=0)
    # Results /api/recall's find returns at most.
    recall_max_results: int = Field(10, alias="RECALL_MAX_RESULTS", ge=1, le=100)
    # Minimum cosine of a search result (the server default under a request's score_threshold).
    search_score_threshold: float = Field(0.30, alias="SEARCH_SCORE_THRESHOLD", ge=0, le=1)
    # Sub-queries /find runs at most (the LLM's, or the deterministic fallback's).
    find_max_queries: int = Field(5, alias="FIND_MAX_QUERIES", ge=1, le=10)

    @field_validator("memory_session_ttl", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return seconds_or_duration(value)
