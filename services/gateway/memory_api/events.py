"""memory:* events (reference 001): GET /api/v1/memory/events (SSE) and GET /api/v1/memory/ws
(WebSocket), served by any gateway replica from the one Redis stream every write path feeds
(shared/memory_events.py).

Both need `memory_read` (Engram's `read` permission) and carry only memory:* events of what
the caller may read (its own and its groups' tenants; the master key: all). `types` picks a
comma-separated subset (anything else is 400, not a connection that never delivers).
`Last-Event-ID` (the header, which wins: a browser resends the first URL on reconnect) or
`since` (an event id, or a millisecond timestamp) resumes after that event; a resumption
the log can no longer serve starts with `stream:gap`, a subscriber that fell further behind
than the log keeps gets `stream:lagged`, each followed by what the log still holds.

Each gateway process runs one EventHub: a single XREAD BLOCK loop keeps the newest RING_SIZE
events in memory and wakes every subscriber of the process, so 100 subscribers cost one
Redis read, not 100. A subscriber reads from Redis itself only while it is older than the
ring (a resumption, a slow consumer).

SSE: `id:` is the event id, `event:` its type, `data:` its JSON payload; every keep-alive is
a comment, preceded by an id-only block when the subscriber's position moved past events its
filters skipped (a browser's EventSource takes the id and dispatches nothing), so a
reconnect does not scan them again. WebSocket: one JSON text message per event,
{"id", "event", "data"}, the same fields. Credentials as on the rest of /api/v1/memory:
`X-API-Key` or `Authorization: Bearer` (the WebSocket handshake carries them as headers; the
front door serves HTTP only, so the WebSocket route checks them itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Header, Query, Request, WebSocket, WebSocketDisconnect
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import HTTPConnection
from starlette.responses import Response, StreamingResponse

from services.gateway.core.auth import bearer_token
from services.gateway.core.caller import API_KEY_HEADER, caller, has_permission
from services.gateway.core.scope import TOKEN_SCOPE_KEY
from services.gateway.core.state import gateway_state
from services.gateway.memory_api.wire import error_response, oauth_token
from shared import background
from shared.domain.principal import Principal, TenantScope
from shared.memory_events import (
    EVENT_TYPES,
    STREAM_GAP,
    STREAM_LAGGED,
    EventLog,
    LoggedEvent,
    StreamId,
    visible,
)
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1/memory", tags=["Memory"])

HUB_ATTRIBUTE = "memory_event_hub"
# Events kept in each gateway's memory: ~300 bytes each, ~3 MB. A subscriber less than this
# many events behind (every live one) is served from here; only resumptions and stalled
# consumers read Redis.
RING_SIZE = 10_000
# Entries per XREAD / XRANGE. The hub's block is short enough that a cancelled lifespan
# ends promptly and long enough that an idle stream costs ~nothing.
READ_COUNT = 500
BLOCK_MS = 5_000
# The hub's retry after Redis refused, doubling to the cap while it keeps refusing.
RETRY_S, RETRY_MAX_S = 0.5, 10.0
# A browser's EventSource waits this long before reconnecting (with Last-Event-ID).
SSE_RETRY_MS = 2_000
# An open subscription re-reads its key before it delivers, at most this often, and at every
# keep-alive (as an MCP session re-checks its key on every request): a key set inactive or
# deleted, or one that lost `read`, gets no event from this long after the change on, and a
# change of the key's groups changes what it is sent. The read is the key cache's (one Redis
# GET of the key generation while nothing changed), so a busy stream costs one per
# subscriber per second, not one per event.
RECHECK_SECONDS = 1.0


class EventHub:
    """The newest events of the stream, read once per gateway process. Every entry newer than
    `floor` and up to `head` is in the ring; subscribers wait on `arrived()`."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._ring: deque[LoggedEvent] = deque(maxlen=RING_SIZE)
        self.floor: StreamId | None = None  # None until the hub has its first position
        self.head: StreamId | None = None
        self._arrival = asyncio.Event()

    def arrived(self) -> asyncio.Event:
        """Set at the next batch. Take it before looking, so a batch between the look and
        the wait is not missed."""
        return self._arrival

    def after(self, cursor: StreamId) -> list[LoggedEvent] | None:
        """The ring's events newer than `cursor`; None when the ring cannot say (the
        cursor is older than what it holds, or the hub has not started)."""
        if self.floor is None or cursor < self.floor:
            return None
        if not self._ring or cursor >= self._ring[-1].id:
            return []
        # Subscribers are nearly always at the head: scan from the newest end.
        start = len(self._ring)
        while start > 0 and self._ring[start - 1].id > cursor:
            start -= 1
        return [self._ring[i] for i in range(start, len(self._ring))]

    async def run(self) -> None:
        retry = RETRY_S
        while True:
            try:
                if self.head is None:
                    self.head = self.floor = (await self.log.bounds()).last
                batch = await self.log.wait(self.head, READ_COUNT, BLOCK_MS)
            except (RedisError, OSError):
                logger.warning("memory events: the stream is unreachable; retrying in %.1f s", retry, exc_info=True)
                await asyncio.sleep(retry)
                retry = min(RETRY_MAX_S, retry * 2)
                continue
            retry = RETRY_S
            if not batch:
                continue
            for event in batch:
                if len(self._ring) == RING_SIZE:
                    self.floor = self._ring[0].id
                self._ring.append(event)
            self.head = batch[-1].id
            arrival, self._arrival = self._arrival, asyncio.Event()
            arrival.set()


@asynccontextmanager
async def running(app: FastAPI, settings: GatewaySettings) -> AsyncIterator[None]:
    """The lifespan's part: this process's hub, on a Redis client of its own whose socket
    timeout outlasts XREAD's block (the request-path client gives up after 250 ms)."""
    if not settings.redis_active:
        setattr(app.state, HUB_ATTRIBUTE, None)
        yield
        return
    timeout = BLOCK_MS / 1000 + settings.redis_timeout.total_seconds() + 5
    client = Redis.from_url(settings.redis_url, socket_connect_timeout=settings.redis_timeout.total_seconds() + 1,
                            socket_timeout=timeout)
    hub = EventHub(EventLog(client, settings))
    setattr(app.state, HUB_ATTRIBUTE, hub)
    reading = asyncio.create_task(hub.run())
    try:
        yield
    finally:
        await background.stop(reading)
        await client.aclose()


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class Frame:
    """One thing to send: an event, a gap / lag signal, or (event None) a keep-alive that
    carries the subscriber's position."""

    id: StreamId
    event: str | None = None
    data: dict[str, Any] | None = None


def parse_types(types: str | None) -> frozenset[str]:
    if types is None:
        return frozenset(EVENT_TYPES)
    names = [name.strip() for name in types.split(",") if name.strip()]
    unknown = [name for name in names if name not in EVENT_TYPES]
    if not names or unknown:
        raise BadRequest(f"types: {', '.join(unknown) or 'empty'}; expected a comma-separated subset of {', '.join(EVENT_TYPES)}")
    return frozenset(names)


def parse_resume(last_event_id: str | None, since: str | None) -> StreamId | None:
    for name, value in (("Last-Event-ID", last_event_id), ("since", since)):
        if value is not None and value.strip():
            try:
                return StreamId.parse(value)
            except ValueError:
                raise BadRequest(f"{name}: not an event id (<ms>-<seq>) or a millisecond timestamp") from None
    return None


@dataclass
class Subscription:
    hub: EventHub
    scope: TenantScope
    types: frozenset[str]
    cursor: StreamId
    # What the caller may read now (None: nothing any more), re-read every RECHECK_SECONDS.
    recheck: Callable[[], Awaitable[TenantScope | None]] | None = None
    checked_at: float = 0.0

    @classmethod
    async def open(
        cls, hub: EventHub, principal: Principal, types: frozenset[str], resume: StreamId | None,
        recheck: Callable[[], Awaitable[TenantScope | None]] | None = None,
    ) -> tuple[Subscription, Frame | None]:
        """Where the subscriber starts, and the stream:gap it starts with if the log lost
        events after its resumption point. Raises RedisError while the stream is unreachable."""
        bounds = await hub.log.bounds()
        sub = cls(hub, principal.reads, types, bounds.last if resume is None else resume, recheck)
        sub.checked_at = asyncio.get_running_loop().time()
        if resume is None or not bounds.lost_after(resume):
            return sub, None
        sub.cursor = bounds.first.before() if bounds.first is not None and resume <= bounds.last else bounds.last
        return sub, Frame(sub.cursor, STREAM_GAP, _loss(resume, bounds.first))

    async def still_reads(self, *, now: bool = False) -> bool:
        """Whether the caller may still read, its scope refreshed (when a check is due)."""
        clock = asyncio.get_running_loop().time()
        if self.recheck is None or (not now and clock - self.checked_at < RECHECK_SECONDS):
            return True
        scope = await self.recheck()
        self.checked_at = clock
        if scope is None:
            return False
        self.scope = scope
        return True

    async def frames(self, keepalive: float) -> AsyncIterator[Frame]:
        """Events from the cursor on, until the caller may no longer read; a position-only
        Frame every `keepalive` seconds without one."""
        while True:
            arrival = self.hub.arrived()
            try:
                batch = self.hub.after(self.cursor)
                if batch is None:  # older than this process keeps: read the log itself
                    bounds = await self.hub.log.bounds()
                    if bounds.lost_after(self.cursor):
                        lost_from = self.cursor
                        self.cursor = bounds.first.before() if bounds.first is not None else bounds.last
                        yield Frame(self.cursor, STREAM_LAGGED, _loss(lost_from, bounds.first))
                    batch = await self.hub.log.after(self.cursor, READ_COUNT)
            except (RedisError, OSError):
                logger.warning("memory events: a subscriber's read failed; it waits for the hub", exc_info=True)
                batch = []
            if batch:
                for event in batch:
                    if not await self.still_reads():
                        return
                    self.cursor = event.id
                    if event.type in self.types and visible(self.scope, event.key_id):
                        yield Frame(event.id, event.type, event.data)
                continue
            try:
                await asyncio.wait_for(arrival.wait(), timeout=keepalive)
            except TimeoutError:
                if not await self.still_reads(now=True):
                    return
                yield Frame(self.cursor)


def _loss(lost_after: StreamId, oldest: StreamId | None) -> dict[str, Any]:
    return {"lastEventId": str(lost_after), "oldestEventId": str(oldest) if oldest is not None else None}


def _rechecking(connection: HTTPConnection, token: str | None) -> Callable[[], Awaitable[TenantScope | None]]:
    """The subscription's re-check: the credential's read scope now, None once it is gone
    (inactive, deleted) or no longer holds `read`."""
    authenticator = gateway_state(connection).authenticator

    async def recheck() -> TenantScope | None:
        principal = await authenticator.authenticate(token)
        return principal.reads if principal is not None and has_permission(principal, "read") else None

    return recheck


def _hub(connection: HTTPConnection) -> EventHub | None:
    hub: EventHub | None = getattr(connection.app.state, HUB_ATTRIBUTE, None)
    return hub


NO_STREAM = "memory events need Redis (REDIS_ENABLED=true and REDIS_URL): the event log lives there"
UNREACHABLE = "the event log (Redis) is unreachable"
UNAUTHORIZED = "an API key is required (X-API-Key or Authorization: Bearer)"
FORBIDDEN = "this key lacks the memory_read scope (Engram permission 'read')"
OAUTH_REFUSED = "OAuth access tokens are for /mcp; use an API key here"


def _sse(frame: Frame, sent: StreamId | None) -> bytes:
    if frame.event is None:  # keep-alive: the position, when it moved past skipped events
        return (f"id: {frame.id}\n\n" if sent != frame.id else "").encode() + b": keep-alive\n\n"
    data = json.dumps(frame.data, separators=(",", ":"))
    return f"id: {frame.id}\nevent: {frame.event}\ndata: {data}\n\n".encode()


@router.get(
    "/events",
    summary="memory:* events (SSE)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}},
                     "description": "memory:* events; stream:gap / stream:lagged where events were lost"},
               400: {"description": "a `types` name outside memory:*, or a malformed Last-Event-ID / since"},
               401: {"description": "no or an unknown credential"}, 403: {"description": "the key lacks memory_read"},
               503: {"description": "no Redis, or Redis unreachable"}},
)
async def memory_events(
    request: Request,
    types: str | None = Query(None, description="comma-separated subset of memory:namespaces-changed, memory:entries-changed"),
    since: str | None = Query(None, description="resume after this event id (or from this millisecond timestamp on)"),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
) -> Response:
    principal = caller(request)
    if principal is not None and oauth_token(request):
        return error_response(401, OAUTH_REFUSED)
    if principal is None:
        return error_response(401, UNAUTHORIZED)
    if not has_permission(principal, "read"):
        return error_response(403, FORBIDDEN)
    try:
        wanted, resume = parse_types(types), parse_resume(last_event_id, since)
    except BadRequest as exc:
        return error_response(400, str(exc))
    hub = _hub(request)
    if hub is None:
        return error_response(503, NO_STREAM)
    state = gateway_state(request)
    token = request.scope.get(TOKEN_SCOPE_KEY)
    try:
        sub, gap = await Subscription.open(hub, principal, wanted, resume, _rechecking(request, token))
    except (RedisError, OSError):
        logger.warning("memory events: the stream is unreachable", exc_info=True)
        return error_response(503, UNREACHABLE)
    keepalive = state.settings.memory_events_keepalive.total_seconds()

    async def body() -> AsyncIterator[bytes]:
        sent = resume
        yield f"retry: {SSE_RETRY_MS}\n: subscribed at {sub.cursor}\n\n".encode()
        if gap is not None:
            yield _sse(gap, sent)
            sent = gap.id
        async for frame in sub.frames(keepalive):  # ends when the key no longer reads: a reconnect gets the 401
            yield _sse(frame, sent)
            sent = frame.id

    return StreamingResponse(
        body(), media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"},
    )


def _ws_token(websocket: WebSocket) -> str | None:
    return bearer_token(websocket.headers.get("authorization")) or websocket.headers.get(API_KEY_HEADER) or None


async def _refuse(websocket: WebSocket, status: int, message: str) -> None:
    """The handshake's answer as HTTP (status and JSON body) where the server can send one;
    else a close before accept, which servers answer with 403."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(status, message))
    else:
        await websocket.close(code=1008, reason=message[:120])


@router.websocket("/ws")
async def memory_ws(websocket: WebSocket) -> None:
    state = gateway_state(websocket)
    token = _ws_token(websocket)
    if token is not None and oauth_token(websocket, token):
        await _refuse(websocket, 401, OAUTH_REFUSED)
        return
    principal = await state.authenticator.authenticate(token) if token else None
    if principal is None:
        await _refuse(websocket, 401, UNAUTHORIZED)
        return
    if not has_permission(principal, "read"):
        await _refuse(websocket, 403, FORBIDDEN)
        return
    # The front door meters HTTP only: a handshake counts in its key's per-minute window here,
    # as every HTTP request of the key does (the master key, the operator's, is not metered).
    if principal.key_id is not None:
        allowed, retry = await state.limiter.hit("key", principal.key_id, state.settings.key_rate_limit_per_min)
        if not allowed:
            await _refuse(websocket, 429, f"Too Many Requests: retry after {retry} s")
            return
    try:
        wanted = parse_types(websocket.query_params.get("types"))
        resume = parse_resume(websocket.headers.get("last-event-id"), websocket.query_params.get("since"))
    except BadRequest as exc:
        await _refuse(websocket, 400, str(exc))
        return
    hub = _hub(websocket)
    if hub is None:
        await _refuse(websocket, 503, NO_STREAM)
        return
    try:
        sub, gap = await Subscription.open(hub, principal, wanted, resume, _rechecking(websocket, token))
    except (RedisError, OSError):
        await _refuse(websocket, 503, UNREACHABLE)
        return
    await websocket.accept()
    keepalive = state.settings.memory_events_keepalive.total_seconds()

    async def send() -> None:
        if gap is not None:
            await websocket.send_text(_ws_message(gap))
        async for frame in sub.frames(keepalive):
            if frame.event is None:
                continue  # the server's WebSocket pings keep the connection alive
            await websocket.send_text(_ws_message(frame))
        # frames() ended: the key was set inactive or deleted, or lost `read`.
        await websocket.close(code=1008, reason="the API key is no longer valid")

    async def until_closed() -> None:
        while True:  # the client sends nothing the stream needs; a close ends it
            if (await websocket.receive())["type"] == "websocket.disconnect":
                return

    sending = asyncio.create_task(send())
    closing = asyncio.create_task(until_closed())
    try:
        await asyncio.wait({sending, closing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sending, closing):
            task.cancel()
        for task in (sending, closing):
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                await task


def _ws_message(frame: Frame) -> str:
    return json.dumps({"id": str(frame.id), "event": frame.event, "data": frame.data}, separators=(",", ":"))
