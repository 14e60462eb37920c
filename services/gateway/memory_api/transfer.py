"""Export and import of the whole memory store, streamed through the gateway.

GET /memory/export is relayed from recall's cursor as it is written (GET /v1/memory/export
there), and POST /memory/import's body (up to 50 MiB, the one path of this surface above
the 1 MiB default: core/limits.py) is sent on to ingest as it came (POST /v1/memory/import),
which parses it as a stream. Neither is a tool call: a document is not one JSON reply. Both
use the one internal client's connection pool, with its service token and trace headers."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Any

import aiohttp
import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from redis.exceptions import RedisError
from starlette.background import BackgroundTask

from services.common.rpc import CALL_FAILED, CONNECT_FAILED, SERVICE_TOKEN_HEADER
from services.gateway.core.caller import caller
from services.gateway.core.state import gateway_state
from services.gateway.memory_api.wire import error_response
from shared.domain.errors import Unavailable
from shared.domain.memory_banks import PRINCIPAL_HEADER
from shared.telemetry import inject_headers

# A 50 MiB import embeds every entry (~100k short entries: minutes on 2 cores); the call
# waits this long for ingest's answer instead of the tool calls' UPSTREAM_TIMEOUT.
IMPORT_TIMEOUT_SECONDS = 1800.0
logger = logging.getLogger(__name__)
IMPORT_LOCK_PREFIX = "engram:memory-import:"
# Delete the lock only while it is still this import's (not one taken after it expired).
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def _headers(request: Request) -> dict[str, str]:
    principal = caller(request)
    assert principal is not None  # noqa: S101 - the route depends on MemoryRead / MemoryWrite
    settings = gateway_state(request).settings
    return inject_headers({SERVICE_TOKEN_HEADER: settings.service_token, PRINCIPAL_HEADER: json.dumps(principal.to_wire())})


async def export_store(request: Request) -> Response:
    upstreams = gateway_state(request).upstreams
    last: Exception | None = None
    for url in upstreams.urls("recall"):
        try:
            reply = await upstreams.http.get(f"{url}/v1/memory/export", headers=_headers(request))
        except CONNECT_FAILED as exc:
            last = exc
            continue
        except CALL_FAILED as exc:
            raise Unavailable(f"recall service unavailable ({exc.__class__.__name__})") from exc
        if reply.status != 200:
            reply.release()
            raise Unavailable(f"recall service error: HTTP {reply.status}")
        return StreamingResponse(reply.content.iter_any(), media_type="application/json", background=BackgroundTask(reply.release))
    raise Unavailable("recall service unavailable") from last


def import_lock_name(key_id: str | None) -> str:
    return f"{IMPORT_LOCK_PREFIX}{key_id or 'master'}"


async def import_document(request: Request, on_conflict: str) -> Response:
    """One import per key at a time, on every replica: a 50 MiB import holds ingest for minutes,
    so a key's second one while the first runs is a 429, not another embedder's worth of work
    (the per-minute window alone would let a key start dozens). Without Redis, unbounded."""
    state = gateway_state(request)
    principal = caller(request)
    assert principal is not None  # noqa: S101 - the route depends on MemoryWrite
    redis, lock, token = state.redis, import_lock_name(principal.key_id), uuid.uuid4().hex
    try:
        if redis is not None and not await redis.set(lock, token, nx=True, ex=int(IMPORT_TIMEOUT_SECONDS) + 60):
            return error_response(429, "an import of this key is already running; retry once it has finished")
    except (RedisError, OSError):
        logger.warning("memory import: Redis unreachable, the import runs without its per-key lock", exc_info=True)
        redis = None
    try:
        return await _import(request, on_conflict)
    finally:
        if redis is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(RedisError, OSError):
                await redis.eval(_RELEASE, 1, lock, token)  # else it expires


async def _import(request: Request, on_conflict: str) -> Response:
    upstreams = gateway_state(request).upstreams
    url = upstreams.urls("ingest")[0]
    try:
        async with upstreams.http.post(
            f"{url}/v1/memory/import", params={"onConflict": on_conflict}, data=request.stream(),
            headers={**_headers(request), "content-type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=upstreams.timeout.sock_connect, sock_read=IMPORT_TIMEOUT_SECONDS),
        ) as reply:
            status, raw = reply.status, await reply.read()
    except CALL_FAILED as exc:
        raise Unavailable(f"ingest service unavailable ({exc.__class__.__name__})") from exc
    try:
        body: Any = json.loads(raw)
    except ValueError:
        raise Unavailable(f"ingest service error: HTTP {status}") from None
    if status != 200:
        if isinstance(body, dict) and "httpStatus" in body:
            return error_response(int(body["httpStatus"]), str(body["message"]))
        raise Unavailable(f"ingest service error: HTTP {status}")
    return JSONResponse(body)
