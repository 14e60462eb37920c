"""Redis clients for the request path: short timeouts, no retries, and a circuit breaker.

With Redis hung (it accepts connections and answers nothing) redis-py's defaults let every
call wait out its socket timeout (5 s a command here), and with Redis down kombu's
connection retries added ~6 s to each job sent. A request-path client from here gives a call
at most REDIS_TIMEOUT, and once a connect has failed every caller of that client is refused
at once (a RedisError, which callers already handle) for REDIS_BREAKER_COOLDOWN; then a
single call probes and, if Redis answers, the client is closed again. An outage costs a
request microseconds after the first failure instead of seconds on every call.

The breaker sits in the connection: a connect (which includes the handshake, a command)
asks it first and trips it on failure, and so does a read that times out. A server that
hangs under open connections fails each of them once by timeout; redis-py drops them, and
their next connects are refused at once. Clients take no blocking commands (BLMOVE and the
like would outlast the timeout): recall's effects queue polls for that reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.settings import CommonSettings

logger = logging.getLogger(__name__)

BREAKER_OPENED = Counter("engram_redis_breaker_opened_total", "Times a request-path Redis client stopped calling Redis")


class Breaker:
    """Closed until a failure; then open (refuse) for `cooldown` seconds; then one probe."""

    def __init__(self, cooldown: float) -> None:
        self.cooldown = cooldown
        self._open_until = 0.0

    @property
    def is_open(self) -> bool:
        return time.monotonic() < self._open_until

    def allow(self) -> bool:
        now = time.monotonic()
        if now < self._open_until:
            return False
        if self._open_until:
            # Half open: this caller probes; the others keep failing fast until it is done.
            self._open_until = now + self.cooldown
        return True

    def failed(self) -> None:
        if not self._open_until:
            BREAKER_OPENED.inc()
            logger.warning("Redis unreachable; request paths skip it for %.1f s at a time", self.cooldown)
        self._open_until = time.monotonic() + self.cooldown

    def succeeded(self) -> None:
        if self._open_until:
            logger.info("Redis reachable again")
        self._open_until = 0.0


class BreakerConnection(Connection):
    def __init__(self, *, breaker: Breaker, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._breaker = breaker

    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self.is_connected:
            return
        if not self._breaker.allow():
            raise RedisConnectionError("Redis skipped: it failed within the breaker's cooldown")
        try:
            await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)
        except (RedisConnectionError, RedisTimeoutError):
            self._breaker.failed()
            raise
        self._breaker.succeeded()

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        # A server that hangs under an open connection shows here first; tripping now spares
        # the next caller a connect that would wait out the same timeout.
        try:
            return await super().read_response(*args, **kwargs)
        except RedisTimeoutError:
            self._breaker.failed()
            raise


def request_path_redis(url: str, settings: CommonSettings) -> Redis:
    """A redis.asyncio client whose calls cost at most settings.redis_timeout and nothing
    while its breaker is open. No connection is made until first used."""
    timeout = settings.redis_timeout.total_seconds()
    return Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        # redis-py 6+ retries a failed call 3 times with backoff by default: a multiplier on
        # every timeout above.
        retry=Retry(NoBackoff(), 0),
        connection_class=BreakerConnection,
        breaker=Breaker(settings.redis_breaker_cooldown.total_seconds()),
    )
