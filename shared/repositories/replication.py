"""WAL positions of the primary and of streaming replicas (shared/read_routing.py).

LSNs travel as integers (bytes since 0/0, `pg_lsn - '0/0'`): comparable in Python and
storable in Redis without a pg_lsn codec.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class StandbyStatus:
    in_recovery: bool
    replay_lsn: int | None
    receive_lsn: int | None
    # Seconds since the last transaction replayed was committed on the primary (None before
    # the first one): the standard lag figure, meaningless while the primary is idle.
    replay_age_s: float | None


async def write_position(conn: asyncpg.Connection) -> int:
    """The primary's WAL insert position: at or past the end of every transaction that has
    committed (the commit record is inserted before COMMIT returns, synchronous or not)."""
    return int(await conn.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))


async def flushed_position(conn: asyncpg.Connection) -> int:
    """The primary's WAL flush position: what a standby can have received by now."""
    return int(await conn.fetchval("SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn"))


async def standby_status(conn: asyncpg.Connection) -> StandbyStatus:
    row = await conn.fetchrow(
        """
        SELECT pg_is_in_recovery() AS in_recovery,
               pg_last_wal_replay_lsn() - '0/0'::pg_lsn AS replay,
               pg_last_wal_receive_lsn() - '0/0'::pg_lsn AS receive,
               extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 AS replay_age
        """
    )
    assert row is not None  # noqa: S101 - a SELECT without FROM returns one row
    return StandbyStatus(
        in_recovery=bool(row["in_recovery"]),
        replay_lsn=int(row["replay"]) if row["replay"] is not None else None,
        receive_lsn=int(row["receive"]) if row["receive"] is not None else None,
        replay_age_s=row["replay_age"],
    )


async def replay_position(conn: asyncpg.Connection) -> int | None:
    value = await conn.fetchval("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn")
    return int(value) if value is not None else None
