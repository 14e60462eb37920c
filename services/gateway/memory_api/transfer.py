"""Export and import of the whole memory store, streamed through the gateway.

GET /memory/export is relayed from recall's cursor as it is written (GET /v1/memory/export
there), and POST /memory/import's body (up to 50 MiB, the one path of this surface above
the 1 MiB default: core/limits.py) is sent on to ingest as it came (POST /v1/memory/import),
which parses it as a stream. Neither is a tool call: a document is not one JSON reply. Both
use the one internal client's connection pool, with its service token and trace headers."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from services.common.rpc import SERVICE_TOKEN_HEADER
from services.gateway.core.caller import caller
from services.gateway.core.state import gateway_state
from services.gateway.memory_api.wire import error_response
from shared.domain.errors import Unavailable
from shared.domain.memory_banks import PRINCIPAL_HEADER
from shared.telemetry import inject_headers

# A 50 MiB import embeds every entry (~100k short entries: minutes on 2 cores); the call
# waits this long for ingest's answer instead of the tool calls' UPSTREAM_TIMEOUT.
IMPORT_TIMEOUT_SECONDS = 1800.0


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
            outgoing = upstreams.http.build_request("GET", f"{url}/v1/memory/export", headers=_headers(request))
            reply = await upstreams.http.send(outgoing, stream=True)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            last = exc
            continue
        except httpx2.HTTPError as exc:
            raise Unavailable(f"recall service unavailable ({exc.__class__.__name__})") from exc
        if reply.status_code != 200:
            await reply.aclose()
            raise Unavailable(f"recall service error: HTTP {reply.status_code}")
        return StreamingResponse(reply.aiter_raw(), media_type="application/json", background=BackgroundTask(reply.aclose))
    raise Unavailable("recall service unavailable") from last


async def import_document(request: Request, on_conflict: str) -> Response:
    upstreams = gateway_state(request).upstreams
    url = upstreams.urls("ingest")[0]
    try:
        reply = await upstreams.http.post(
            f"{url}/v1/memory/import", params={"onConflict": on_conflict}, content=request.stream(),
            headers={**_headers(request), "content-type": "application/json"}, timeout=IMPORT_TIMEOUT_SECONDS,
        )
    except httpx2.HTTPError as exc:
        raise Unavailable(f"ingest service unavailable ({exc.__class__.__name__})") from exc
    try:
        body: Any = reply.json()
    except ValueError:
        raise Unavailable(f"ingest service error: HTTP {reply.status_code}") from None
    if reply.status_code != 200:
        if isinstance(body, dict) and "httpStatus" in body:
            return error_response(int(body["httpStatus"]), str(body["message"]))
        raise Unavailable(f"ingest service error: HTTP {reply.status_code}")
    return JSONResponse(body)
