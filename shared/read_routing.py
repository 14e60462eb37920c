"""Recall's reads on Postgres streaming replicas, with read-your-writes.

A `ReadRouter` holds one pool per replica (DATABASE_REPLICA_URLS) beside the primary's. A
health loop asks each replica, every DATABASE_REPLICA_CHECK_INTERVAL, how far it has replayed
(`pg_last_wal_replay_lsn()`) and compares that with the primary's flushed WAL position sampled
on the same tick: a replica's lag is how long ago the primary first had WAL the replica has
not replayed yet (0 when it has everything). This stays right on an idle primary, where
`now() - pg_last_xact_replay_timestamp()` keeps growing; that figure is used only while the
primary cannot be asked. A replica that does not answer, is not a standby, or lags more than
DATABASE_REPLICA_MAX_LAG is not used until a later check finds it fit again.

Read-your-writes: after every write call, ingest (and recall, after tool_feedback) stores the
primary's WAL insert position under the writing key in Redis (`engram:db:write_lsn:<key>`,
kept as the maximum, WRITE_POSITION_TTL_S). A read takes the highest position among the keys
whose rows the caller can read (its own and its groups'), and is served by a replica that has
replayed it, waiting up to DATABASE_REPLICA_READ_WAIT for one, else by the primary. Past the
TTL every usable replica has replayed the write anyway (their lag is bounded far below it).
Without Redis (or with Redis away) the primary's current position stands in for the caller's
last write: still read-your-writes, at one small primary query per read.

The chosen pool rides in a context variable for the duration of one tool call; `RoutedPool`
(what recall's handlers hold as their pool) lends connections from it, or from the primary
outside a routed call. Side effects (recall's effects queue) use the primary pool directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import asyncpg
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from shared.db import create_replica_pool
from shared.domain.principal import Principal
from shared.repositories import replication
from shared.settings import RecallSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")

WRITE_POSITION_KEY = "engram:db:write_lsn:{owner}"
# The master key's own writes (its key_id is None).
MASTER_OWNER = "master"
# A write position is kept this long after the owner's last write. It must outlast the worst
# lag a replica may have and still be used (DATABASE_REPLICA_MAX_LAG, at most 120 s, plus one
# check interval, at most 10 s): after that every usable replica has the write.
WRITE_POSITION_TTL_S = 300
# Keep the larger of the stored and the new position (two writes of one key may finish in
# either order). Positions are 16 hex digits, so string order is numeric order.
_KEEP_MAX = """
local current = redis.call('GET', KEYS[1])
if (not current) or ARGV[1] > current then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
else
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 1
"""
# A health probe (connect + one query) that takes longer than this counts as "unreachable".
PROBE_TIMEOUT_S = 1.0
# While waiting for a replica to replay a caller's write: the first re-check after 2 ms (a
# loopback or LAN standby replays a small write in about a millisecond), then doubling to 50 ms.
REPLAY_POLL_FIRST_S = 0.002
REPLAY_POLL_MAX_S = 0.05

# Failures that say "this replica cannot serve now" (it died, restarts, refuses connections,
# cancelled the query for a conflict with recovery, or the call tried to write): the call is
# served again by the primary, the caller sees no error.
REPLICA_FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.TooManyConnectionsError,
)

READS = Counter("engram_recall_db_reads_total", "Recall tool calls by the Postgres node that served their reads", ["target"])
READS_REPLICA, READS_PRIMARY = READS.labels("replica"), READS.labels("primary")
FALLBACKS = Counter(
    "engram_db_replica_fallbacks_total",
    "Reads sent to the primary although replicas are configured, by reason "
    "(none_usable: all down or lagging; not_replayed: the caller's last write not replayed within the wait; "
    "replica_error: the replica failed during the call)",
    ["reason"],
)
FALLBACK_NONE_USABLE, FALLBACK_NOT_REPLAYED, FALLBACK_ERROR = (
    FALLBACKS.labels("none_usable"), FALLBACKS.labels("not_replayed"), FALLBACKS.labels("replica_error"),
)
REPLICA_USABLE = Gauge("engram_db_replica_usable", "1 while the replica (by its index in DATABASE_REPLICA_URLS) serves reads", ["replica"])
REPLICA_LAG = Gauge("engram_db_replica_lag_seconds", "How far the replica's replay is behind the primary at the last check", ["replica"])

_routed: ContextVar[asyncpg.Pool | None] = ContextVar("engram_read_pool", default=None)


def owner_name(key_id: str | None) -> str:
    return key_id if key_id is not None else MASTER_OWNER


def format_position(lsn: int) -> str:
    return f"{lsn:016x}"


async def record_write_position(pool: asyncpg.Pool, redis: Any | None, principal: Principal) -> None:
    """After a write call committed: remember where the primary's WAL was, under the writing
    key. Best effort: without it a read by this key may be served by a replica within the lag
    bound (it is logged)."""
    if redis is None:
        return
    try:
        async with pool.acquire() as conn:
            lsn = await replication.write_position(conn)
        await redis.eval(
            _KEEP_MAX, 1, WRITE_POSITION_KEY.format(owner=owner_name(principal.key_id)), format_position(lsn), WRITE_POSITION_TTL_S,
        )
    except (RedisError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        logger.warning("could not record the write position for read-your-writes: %s", exc.__class__.__name__)


class RoutedPool:
    """Stands in for the primary pool in recall's resources: `acquire()` lends a connection
    of the pool chosen for the current tool call (a replica), else of the primary. Everything
    else (sizes for /metrics, close) is the primary's."""

    def __init__(self, primary: asyncpg.Pool) -> None:
        self._primary = primary

    def acquire(self, *, timeout: float | None = None) -> Any:
        return (_routed.get() or self._primary).acquire(timeout=timeout)

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - asyncpg.Pool.release's signature
        await (_routed.get() or self._primary).release(connection, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._primary, name)


def reading_replica() -> bool:
    """True inside a tool call served by a replica."""
    return _routed.get() is not None


def primary_pool(pool: asyncpg.Pool) -> asyncpg.Pool:
    """The primary behind recall's pool (the pool itself without replicas)."""
    return pool._primary if isinstance(pool, RoutedPool) else pool


async def on_primary(pool: asyncpg.Pool, conn: asyncpg.Connection, query: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run a query that writes (a sequence's nextval: a standby refuses it) on `conn`, or on
    a primary connection when the call is served by a replica."""
    if not reading_replica():
        return await query(conn)
    async with primary_pool(pool).acquire() as primary:
        return await query(primary)


@dataclass
class Replica:
    index: int
    url: str
    pool: asyncpg.Pool
    usable: bool = False
    replay_lsn: int | None = None
    lag_s: float | None = None
    state: str = "unchecked"
    probe: asyncpg.Connection | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return str(self.index)


class ReadRouter:
    def __init__(self, primary: asyncpg.Pool, replicas: list[Replica], settings: RecallSettings, redis: Any | None) -> None:
        self.primary = primary
        self.replicas = replicas
        self.redis = redis
        self.max_lag_s = settings.database_replica_max_lag.total_seconds()
        self.read_wait_s = settings.database_replica_read_wait.total_seconds()
        self.interval_s = settings.database_replica_check_interval.total_seconds()
        self.strategy = settings.database_replica_strategy
        self._turn = itertools.count()
        # (monotonic time, primary flushed LSN) of recent checks, oldest first.
        self._samples: deque[tuple[float, int]] = deque()
        # What recall's handlers hold as their pool; the primary itself without replicas.
        self.pool = cast(asyncpg.Pool, RoutedPool(primary)) if replicas else primary  # duck-typed: see RoutedPool

    @classmethod
    async def open(
        cls, primary: asyncpg.Pool, settings: RecallSettings, redis: Any | None, server_settings: dict[str, str] | None = None,
    ) -> ReadRouter:
        replicas = [
            Replica(i, url, await create_replica_pool(url, max_size=settings.db_pool_max, server_settings=server_settings))
            for i, url in enumerate(settings.database_replica_urls)
        ]
        router = cls(primary, replicas, settings, redis)
        if replicas:
            await router.check()  # the first reads already know which replicas serve
        return router

    @property
    def enabled(self) -> bool:
        return bool(self.replicas)

    # ------------------------------------------------------------------ health

    async def run(self) -> None:
        """The health loop (a task of recall's lifespan): a check that fails in a way the
        probes do not expect is logged, and the next one runs as usual."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # top of a background loop: it must outlive one bad check
                logger.exception("read replica health check failed")

    async def check(self) -> None:
        now = time.monotonic()
        primary_lsn = await self._primary_position()
        if primary_lsn is not None:
            self._samples.append((now, primary_lsn))
        horizon = now - self.max_lag_s - 2 * self.interval_s
        while len(self._samples) > 1 and self._samples[0][0] < horizon:
            self._samples.popleft()
        await asyncio.gather(*(self._probe(r, now, primary_lsn is not None) for r in self.replicas))

    async def _primary_position(self) -> int | None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S), self.primary.acquire() as conn:
                return await replication.flushed_position(conn)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None

    async def _probe(self, replica: Replica, now: float, primary_sampled: bool) -> None:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                if replica.probe is None or replica.probe.is_closed():
                    replica.probe = await asyncpg.connect(replica.url, server_settings={"application_name": "engram-replica-probe"})
                status = await replication.standby_status(replica.probe)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self._drop_probe(replica)
            self._set(replica, False, "unreachable", None, detail=exc.__class__.__name__)
            return
        if not status.in_recovery or status.replay_lsn is None:
            self._set(replica, False, "not_a_standby", None)
            return
        replica.replay_lsn = status.replay_lsn
        lag = self._lag_from_samples(status.replay_lsn, now) if primary_sampled else self._lag_from_standby(status)
        if lag > self.max_lag_s:
            self._set(replica, False, "lagging", lag)
        else:
            self._set(replica, True, "ok", lag)

    def _lag_from_samples(self, replay_lsn: int, now: float) -> float:
        """How long ago the primary first had (flushed) WAL this replica has not replayed."""
        for at, lsn in self._samples:
            if lsn > replay_lsn:
                return now - at
        return 0.0

    @staticmethod
    def _lag_from_standby(status: replication.StandbyStatus) -> float:
        if status.receive_lsn is not None and status.replay_lsn is not None and status.replay_lsn >= status.receive_lsn:
            return 0.0  # replayed all it received (the primary is unknown: this is the best answer)
        return status.replay_age_s if status.replay_age_s is not None else math.inf

    def _set(self, replica: Replica, usable: bool, state: str, lag: float | None, detail: str = "") -> None:
        if replica.state != state:
            log = logger.info if usable else logger.warning
            log("read replica %s is %s%s%s", replica.label, state,
                f" ({detail})" if detail else "", f", lag {lag:.2f} s" if lag is not None and math.isfinite(lag) else "")
        replica.usable, replica.state, replica.lag_s = usable, state, lag
        REPLICA_USABLE.labels(replica.label).set(1 if usable else 0)
        if lag is not None and math.isfinite(lag):
            REPLICA_LAG.labels(replica.label).set(lag)

    async def _drop_probe(self, replica: Replica) -> None:
        probe, replica.probe = replica.probe, None
        if probe is not None:
            probe.terminate()

    async def failed(self, replica: Replica, exc: BaseException) -> None:
        """A call on this replica failed: stop using it until a check finds it fit, and let
        its pool replace its connections (a restarted replica broke every one of them)."""
        FALLBACK_ERROR.inc()
        self._set(replica, False, "failed", replica.lag_s, detail=exc.__class__.__name__)
        await replica.pool.expire_connections()

    # ------------------------------------------------------------------ choice

    def _ordered(self) -> list[Replica]:
        usable = [r for r in self.replicas if r.usable]
        if self.strategy == "least_lag":
            return sorted(usable, key=lambda r: (r.lag_s or 0.0, -(r.replay_lsn or 0)))
        if not usable:
            return usable
        start = next(self._turn) % len(usable)
        return usable[start:] + usable[:start]

    async def choose(self, principal: Principal) -> Replica | None:
        """The replica to serve this caller's read, or None for the primary."""
        ordered = self._ordered()
        if not ordered:
            FALLBACK_NONE_USABLE.inc()
            return None
        required = await self._required_position(principal)
        if required is None:
            return ordered[0]
        for replica in ordered:
            if replica.replay_lsn is not None and replica.replay_lsn >= required:
                return replica
        deadline = time.monotonic() + self.read_wait_s
        pause = REPLAY_POLL_FIRST_S
        while True:
            for replica in ordered:
                if replica.usable and await self._replayed(replica, required):
                    return replica
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                FALLBACK_NOT_REPLAYED.inc()
                return None
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, REPLAY_POLL_MAX_S)

    async def _replayed(self, replica: Replica, required: int) -> bool:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S), replica.pool.acquire() as conn:
                lsn = await replication.replay_position(conn)
        except REPLICA_FAILURES as exc:
            await self.failed(replica, exc)
            return False
        if lsn is None:
            return False
        replica.replay_lsn = lsn
        return lsn >= required

    async def _required_position(self, principal: Principal) -> int | None:
        """The newest write position among the keys whose rows the caller reads (None: no
        recent write to wait for)."""
        if self.redis is not None:
            owners = sorted({owner_name(principal.key_id), *(k for k in principal.visible_key_ids if k)})
            try:
                values = await self.redis.mget([WRITE_POSITION_KEY.format(owner=o) for o in owners])
            except RedisError:
                pass
            else:
                found = [int(v, 16) for v in values if v is not None]
                return max(found) if found else None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S), self.primary.acquire() as conn:
                return await replication.write_position(conn)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None  # the primary is away too: a replica serves what it has

    @contextlib.contextmanager
    def reading_from(self, replica: Replica | None) -> Iterator[None]:
        """Inside, RoutedPool lends connections of this replica (None: of the primary). The
        call is counted for the node once it has been served there."""
        token = _routed.set(replica.pool if replica is not None else None)
        try:
            yield
        finally:
            _routed.reset(token)
        (READS_PRIMARY if replica is None else READS_REPLICA).inc()

    async def record_write(self, principal: Principal) -> None:
        if self.enabled:
            await record_write_position(self.primary, self.redis, principal)

    async def close(self) -> None:
        for replica in self.replicas:
            await self._drop_probe(replica)
            await replica.pool.close()
