"""What read-your-writes on a streaming replica costs (README "Read replicas for recall").

A private embedded primary, a standby made from it by pg_basebackup -R, and a Redis, all on
loopback. Prints:
- replay delay: from a committed write on the primary until the standby has replayed its WAL
  insert position (polled every 0.5 ms);
- the router's choice (`ReadRouter.choose`) for a key with no recent write (one Redis MGET),
  right after that key's write (the write position recorded, then the wait for the standby),
  and without Redis (the primary's position stands in for the key's last write);
- what recording a write position costs ingest after each write call.

    python -m bench.read_replicas [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from redis.asyncio import Redis

from services.stack.postgres import EmbeddedPostgres
from services.stack.redis_server import LocalRedis
from services.stack.standby import psql, start_standby
from services.stack.supervisor import free_port
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.read_routing import ReadRouter, record_write_position
from shared.repositories import replication
from shared.settings import RecallSettings


def summary(label: str, ms: list[float], extra: str = "") -> None:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    print(f"{label:<58} p50 {statistics.median(ordered):7.2f} ms  p95 {p95:7.2f} ms  max {ordered[-1]:7.2f} ms  {extra}")  # noqa: T201


async def measure(primary: EmbeddedPostgres, standby: EmbeddedPostgres, redis_url: str, n: int) -> None:
    psql(primary, "CREATE EXTENSION IF NOT EXISTS vector", database=primary.database)
    psql(primary, "CREATE TABLE IF NOT EXISTS bench_replay (id bigserial PRIMARY KEY, note text)", database=primary.database)
    pool = await create_pool(primary.url, min_size=2, max_size=4)
    redis = Redis.from_url(redis_url)
    settings = RecallSettings(DATABASE_URL=primary.url, DATABASE_REPLICA_URLS=standby.url)
    principal = Principal(key_id="bench-key")
    try:
        standby_conn = await create_pool(standby.url, min_size=1, max_size=1)
        replay: list[float] = []
        for i in range(n):
            async with pool.acquire() as conn:
                await conn.execute("INSERT INTO bench_replay (note) VALUES ($1)", f"write {i}")
                lsn = await replication.write_position(conn)
            started = time.perf_counter()
            async with standby_conn.acquire() as sconn:
                while (await replication.replay_position(sconn) or 0) < lsn:  # noqa: ASYNC110 - polling Postgres is the measurement
                    await asyncio.sleep(0.0005)
            replay.append((time.perf_counter() - started) * 1000)
        await standby_conn.close()
        summary("replay delay on loopback (write -> standby replayed it)", replay)

        record: list[float] = []
        for _ in range(n):
            started = time.perf_counter()
            await record_write_position(pool, redis, principal)
            record.append((time.perf_counter() - started) * 1000)
        summary("ingest: recording a write position (SQL + Redis)", record)
        await redis.delete("engram:db:write_lsn:bench-key")

        for label, client in (("with Redis", redis), ("without Redis", None)):
            router = await ReadRouter.open(pool, settings, client)
            try:
                idle: list[float] = []
                for _ in range(n):
                    started = time.perf_counter()
                    chosen = await router.choose(principal)
                    idle.append((time.perf_counter() - started) * 1000)
                    assert chosen is not None  # noqa: S101 - the standby is up and caught up
                if client is not None:
                    summary(f"choose, {label}, no recent write of the key", idle)
                    after: list[float] = []
                    on_replica = 0
                    for i in range(n):
                        async with pool.acquire() as conn:
                            await conn.execute("INSERT INTO bench_replay (note) VALUES ($1)", f"ryw {i}")
                        await record_write_position(pool, client, principal)
                        started = time.perf_counter()
                        chosen = await router.choose(principal)
                        after.append((time.perf_counter() - started) * 1000)
                        on_replica += chosen is not None
                    summary(f"choose, {label}, right after the key's write", after, f"standby {on_replica}/{n}")
                else:
                    summary(f"choose, {label} (primary position per read)", idle)
            finally:
                await router.close()
    finally:
        await redis.aclose()
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="engram-bench-replicas-", dir="/tmp"))
    primary = EmbeddedPostgres(root / "primary" / "pg", free_port())
    standby: EmbeddedPostgres | None = None
    redis = LocalRedis(root / "redis", free_port())
    try:
        primary.start()
        standby = start_standby(primary, root / "standby" / "pg", free_port())
        redis.start()
        asyncio.run(measure(primary, standby, redis.url, args.n))
    finally:
        redis.stop()
        for pg in (standby, primary):
            if pg is not None:
                pg.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
