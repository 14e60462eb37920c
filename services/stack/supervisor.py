"""Starts and stops every process of a local Engram stack."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.stack.postgres import EmbeddedPostgres
from services.stack.redis_server import LocalRedis
from services.stack.restart import Backoff, ChildProcess, Supervised, Watchdog, kill_group

logger = logging.getLogger("engram.stack")
# The ONNX export of the embedding model, shared by every stack this checkout starts (make
# run, each test and bench stack): exporting it costs ~20 s of torch per stack otherwise.
MODEL_CACHE = Path(__file__).resolve().parents[2] / ".data" / "models"


# free_port() picks from below the kernel's ephemeral range. A port from that range (what
# binding to port 0 returns) can become the local port of any outgoing connection between
# free_port's check and the service's own bind: a clean-clone CI run lost a test stack's ingest
# to EADDRINUSE that way. Below the range only an explicit bind can take it.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_FROM = 20000
_handed_out: set[int] = set()


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds now and that this process has not handed out
    before, from below the ephemeral range when there is room there."""
    high = ephemeral_start() - 1
    for _ in range(500 if high - PORTS_FROM >= 1000 else 0):
        port = PORTS_FROM + secrets.randbelow(high - PORTS_FROM + 1)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port


def load_or_create_master_key(data_dir: Path) -> str:
    """MEMENTO_ACCESS_KEY wins; otherwise one key is generated once and kept in data_dir."""
    if os.environ.get("MEMENTO_ACCESS_KEY"):
        return os.environ["MEMENTO_ACCESS_KEY"]
    path = data_dir / "master_key"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    key = f"engram-{secrets.token_urlsafe(24)}"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


@dataclass
class StackConfig:
    data_dir: Path
    gateway_port: int = 57332
    recall_ports: list[int] = field(default_factory=lambda: [57333])
    ingest_port: int = 57334
    pg_port: int = 57340
    redis_port: int = 57341
    worker_metrics_port: int = 57342
    database_url: str | None = None
    redis_url: str | None = None
    redis_enabled: bool = True
    master_key: str | None = None
    worker: bool = True
    beat: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    # Restart whatever dies by itself (services, worker, beat, and the Redis and Postgres the
    # stack started), with backoff; off, a dead process stays dead until someone starts it.
    restart: bool = True
    backoff: Backoff = field(default_factory=Backoff)


@dataclass
class ServiceProcess(ChildProcess):
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    # False once stop() was called: the stack's watchdog restarts only what died by itself.
    wanted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def start(self) -> None:
        with self._lock:
            self.wanted = True
            if not self.alive():  # the watchdog may have restarted it already
                self._spawn()

    def _spawn(self) -> None:
        # The child gets its own copy of the descriptor; ours is closed, or each restart leaks one.
        with open(self.log_path, "ab") as log:
            # Own process group, so stopping it stops whatever it forked (Celery's pool).
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


    def signal(self, sig: int) -> None:
        if self.process is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def respawn(self) -> bool:
        with self._lock:
            if not self.wanted or self.alive():
                return False
            if self.process is not None:
                # A killed Celery worker leaves its pool processes behind; as systemd's
                # KillMode=control-group does, nothing of the old group survives a restart.
                kill_group(self.process.pid)
            self._spawn()
        return True

    def ready(self) -> bool:
        if self.health_url is None:
            return self.alive()
        try:
            # Any answer means it serves; /health may say 503 while a dependency is down.
            httpx.get(self.health_url, timeout=2)
        except httpx.HTTPError:
            return False
        return True

    def stop(self, timeout: float = 15) -> None:
        with self._lock:
            self.wanted = False
        if self.process is None:
            return
        if not self.alive():
            kill_group(self.process.pid)  # what a killed worker's pool left running
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(5)


def interrupt_on_stop_signals() -> None:
    """SIGTERM (and SIGINT) raise KeyboardInterrupt in the main thread, once: a process that
    runs a Stack in the foreground (`python -m services.stack run`, a bench's --serve) then
    leaves its `with` / `finally` and stops what it started. Python's default for SIGTERM ends
    the process on the spot, and a shell starts a background job with SIGINT ignored, so
    without this either signal left Postgres, Redis and every service running, orphaned."""
    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.log_dir = (config.log_dir or self.data_dir / "logs").resolve()
        self.postgres: EmbeddedPostgres | None = None
        self.redis: LocalRedis | None = None
        self.processes: dict[str, ServiceProcess] = {}
        self.master_key = config.master_key or load_or_create_master_key(self.data_dir)
        self.service_token = secrets.token_urlsafe(24)
        self.database_url = config.database_url or ""
        self.redis_url = config.redis_url or ""
        self.watchdogs: list[Watchdog] = []
        # What died, how, and when it served again: supervisor.log beside the services' logs.
        self.supervisor_log = self.log_dir / "supervisor.log"
        self._events = logging.getLogger(f"engram.stack.{config.gateway_port}")
        self._events_handler: logging.Handler | None = None

    # -- infrastructure -------------------------------------------------------------
    def start_infrastructure(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.database_url:
            self.postgres = EmbeddedPostgres(self.data_dir / "pg", self.config.pg_port)
            logger.info("starting embedded Postgres on 127.0.0.1:%s", self.config.pg_port)
            self.postgres.start()
            self.database_url = self.postgres.url
        if self.config.redis_enabled and not self.redis_url:
            self.redis = LocalRedis(self.data_dir / "redis", self.config.redis_port)
            logger.info("starting redis-server on 127.0.0.1:%s", self.config.redis_port)
            self.redis.start()
            self.redis_url = self.redis.url
        self.migrate()
        self.prepare_model()

    def migrate(self) -> None:
        import asyncio

        from shared.schema.migrate import migrate

        applied = asyncio.run(migrate(self.database_url))
        logger.info("migrations: %s", applied or "up to date")

    def prepare_model(self) -> None:
        """Export the ONNX model once, before two services race to do it."""
        env = self.base_env()
        subprocess.run([sys.executable, "-m", "shared.embeddings.prepare"], env=env, check=True)

    # -- services ------------------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis_url,
                "REDIS_ENABLED": "true" if self.config.redis_enabled else "false",
                "ENGRAM_SERVICE_TOKEN": self.service_token,
                "EMBEDDING_CACHE_DIR": str(self.model_cache),
                # Workers call the internal services too (reflect, batch inserts).
                "RECALL_URL": ",".join(self.recall_urls),
                "INGEST_URL": self.ingest_url,
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
                # The gateway's admin /logs routes read the services' files here.
                "LOG_DIR": str(self.log_dir),
            }
        )
        env.update(self.config.extra_env)
        return env

    def _uvicorn(self, name: str, module: str, port: int, extra: dict[str, str]) -> ServiceProcess:
        env = self.base_env() | {"PORT": str(port), "OTEL_SERVICE_NAME": f"engram-{name.split('-')[0]}"} | extra
        argv = [
            sys.executable, "-m", "uvicorn", f"{module}:create_app", "--factory",
            "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning",
        ]
        return ServiceProcess(name, argv, env, self.log_dir / f"{name}.log", f"http://127.0.0.1:{port}/health")

    @property
    def model_cache(self) -> Path:
        """Where the services find (or make, once) the ONNX export of the embedding model."""
        return Path(os.environ.get("EMBEDDING_CACHE_DIR") or MODEL_CACHE)

    @property
    def recall_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.config.recall_ports]

    @property
    def ingest_url(self) -> str:
        return f"http://127.0.0.1:{self.config.ingest_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.config.gateway_port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.gateway_url}/mcp"

    def plan(self) -> list[ServiceProcess]:
        planned = [
            self._uvicorn(f"recall-{i}", "services.recall.app", port, {})
            for i, port in enumerate(self.config.recall_ports)
        ]
        planned.append(self._uvicorn("ingest", "services.ingest.app", self.config.ingest_port, {}))
        planned.append(
            self._uvicorn(
                "gateway",
                "services.gateway.app",
                self.config.gateway_port,
                {
                    "MEMENTO_ACCESS_KEY": self.master_key,
                    "RECALL_URL": ",".join(self.recall_urls),
                    "INGEST_URL": self.ingest_url,
                },
            )
        )
        celery = [sys.executable, "-m", "celery", "-A", "services.maintenance.celery_app:app"]
        if self.config.worker and self.config.redis_enabled:
            planned.append(
                ServiceProcess(
                    "worker",
                    [*celery, "worker", "--loglevel", "INFO", "--concurrency", "1", "-Q", "maintenance,batch",
                     "-n", f"engram-{self.config.gateway_port}@%h"],
                    # extra_env still wins: a caller that chose the port knows where to scrape.
                    self.base_env() | {"WORKER_METRICS_PORT": str(self.config.worker_metrics_port)} | self.config.extra_env,
                    self.log_dir / "worker.log",
                )
            )
        if self.config.beat and self.config.redis_enabled:
            planned.append(
                ServiceProcess(
                    "beat",
                    [*celery, "beat", "--loglevel", "INFO", "-s", str(self.data_dir / "celerybeat-schedule")],
                    self.base_env(),
                    self.log_dir / "beat.log",
                )
            )
        return planned

    def start_services(self, timeout: float = 180) -> None:
        for proc in self.plan():
            self.processes[proc.name] = proc
            proc.start()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        pending = {p.name: p for p in self.processes.values() if p.health_url}
        with httpx.Client(timeout=2) as client:
            while pending:
                for name, proc in list(pending.items()):
                    if not proc.alive():
                        raise RuntimeError(f"{name} exited during start-up; see {proc.log_path}")
                    try:
                        response = client.get(proc.health_url)  # type: ignore[arg-type]
                        if response.status_code == 200:
                            del pending[name]
                    except httpx.HTTPError:
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not healthy after {timeout:.0f} s: {sorted(pending)}")
                time.sleep(0.25)

    def start(self) -> None:
        self.start_infrastructure()
        self.start_services()
        if self.config.restart:
            self.supervise()

    def supervised(self) -> list[Supervised]:
        """Everything this stack started and would restart: the data stores it runs itself
        (not a DATABASE_URL / REDIS_URL given to it) and every service process."""
        units: list[Supervised] = [unit for unit in (self.postgres, self.redis) if unit is not None]
        return units + list(self.processes.values())

    def pids(self) -> dict[str, int]:
        """The pid of each supervised process by name (postgres: the postmaster)."""
        return {unit.name: unit.pid for unit in self.supervised() if unit.pid is not None and unit.alive()}

    def supervise(self) -> None:
        """One watchdog thread per process; each restarts its process when it dies."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.supervisor_log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self._events.addHandler(handler)
        # INFO: "is back" lines are the point of this log, whatever the root level is.
        self._events.setLevel(logging.INFO)
        self._events_handler = handler
        self._events.info("supervising %s", ", ".join(unit.name for unit in self.supervised()))
        self.watchdogs = [Watchdog(unit, self.config.backoff, self._events) for unit in self.supervised()]
        for watchdog in self.watchdogs:
            watchdog.start()

    def _stop_supervising(self) -> None:
        # Before anything is stopped: nothing may be restarted during shutdown. A watchdog
        # only spawns (it never waits for a process while holding its lock), so this is quick.
        for watchdog in self.watchdogs:
            watchdog.stop()
        for watchdog in self.watchdogs:
            watchdog.join()
        self.watchdogs = []
        if self._events_handler is not None:
            self._events.info("stopping")
            self._events.removeHandler(self._events_handler)
            self._events_handler.close()
            self._events_handler = None

    def __enter__(self) -> Stack:
        """`with Stack(config) as stack:` starts it and stops everything it started, also when
        starting fails half-way."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop_supervising()
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        self.processes.clear()
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()
