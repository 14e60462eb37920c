"""The internal RPC contract between the gateway and recall / ingest.

`POST /v1/tools/{name}` with `{"arguments", "principal", "session"}`; the reply is
`{"result", "isError"}` or, for a protocol error, an HTTP 4xx/5xx with `{"error": {code,
message, data}}` that the gateway turns back into the same JSON-RPC error.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.rpc import SERVICE_TOKEN_HEADER
from shared.contract.base import problems
from shared.db import ping
from shared.domain.errors import CredentialGone, EngramError, InvalidParams
from shared.domain.principal import Principal
from shared.telemetry import CORRELATION_HEADER, correlation_id, extract_context, new_correlation_id

logger = logging.getLogger(__name__)


HTTP_REQUESTS = Counter("engram_http_requests_total", "HTTP requests served", ["service", "route", "status"])
HTTP_LATENCY = Histogram(
    "engram_http_request_duration_seconds", "HTTP request latency", ["service", "route"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TOOL_CALLS = Counter("engram_tool_calls_total", "Tool calls handled", ["service", "tool", "outcome"])


class ToolRequest(BaseModel):
    arguments: dict[str, Any] = {}
    principal: dict[str, Any]
    session: dict[str, Any] | None = None


class ToolContext(BaseModel):
    """Per-call facts a tool handler needs besides its arguments."""

    model_config = {"arbitrary_types_allowed": True}

    principal: Principal
    session_id: str | None = None
    transport_id: str | None = None


def parse_arguments(model: type[BaseModel], arguments: dict[str, Any]) -> Any:
    """Validate tool arguments; a failure is -32602 naming the parameter(s)."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise InvalidParams("Invalid params: " + "; ".join(problems(exc))) from None


def database_health(service: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    """GET /health of an internal service: ready while its Postgres pool answers."""

    async def health(request: Request) -> JSONResponse:
        try:
            await ping(request.app.state.resources.pool)
        except Exception as exc:  # noqa: BLE001 - top-level health probe: any failure means "not ready"
            return JSONResponse({"status": "degraded", "database": f"error: {exc.__class__.__name__}"}, status_code=503)
        return JSONResponse({"status": "healthy", "service": service, "database": "ok"})

    return health


class _Observe:
    """Trace context in, correlation id, HTTP metrics: plain ASGI, since Starlette's
    BaseHTTPMiddleware runs every request through an extra task and memory streams (recall
    spent 2.1 vs 1.4 ms of CPU per internal tool call, bench/gateway_bench.py's direct case)."""

    def __init__(self, app: ASGIApp, service: str) -> None:
        self.app = app
        self.service = service
        self.tracer = trace.get_tracer(f"engram.{service}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _route_label(self.service, scope["path"])
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        correlation_id.set(headers.get(CORRELATION_HEADER) or new_correlation_id())
        status = 500
        latency_seen = False
        start = time.perf_counter()

        async def observed(message: Message) -> None:
            nonlocal status, latency_seen
            if message["type"] == "http.response.start":
                status = message["status"]
                # Time to the response's start, as before: a stream's length is not latency.
                HTTP_LATENCY.labels(self.service, route).observe(time.perf_counter() - start)
                latency_seen = True
            await send(message)

        span = f"{scope['method']} {route}"
        with self.tracer.start_as_current_span(span, context=extract_context(headers), kind=trace.SpanKind.SERVER):
            try:
                await self.app(scope, receive, observed)
            finally:
                if not latency_seen:
                    HTTP_LATENCY.labels(self.service, route).observe(time.perf_counter() - start)
                HTTP_REQUESTS.labels(self.service, route, str(status)).inc()


def install_observability(app: FastAPI, service: str) -> None:
    """Trace context in, correlation id, HTTP metrics and GET /metrics, for every service."""
    app.add_middleware(_Observe, service=service)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


# Metric labels stay bounded: the first 100 distinct paths per service, then "other".
_ROUTE_LABELS: dict[str, set[str]] = {}


def _route_label(service: str, path: str) -> str:
    if path.startswith("/v1/tools/"):
        return "/v1/tools/{name}"
    seen = _ROUTE_LABELS.setdefault(service, set())
    if path in seen:
        return path
    if len(seen) < 100:
        seen.add(path)
        return path
    return "other"


def install_internal_api(
    app: FastAPI,
    service: str,
    handlers: dict[str, Callable[[Request, ToolContext, dict[str, Any]], Awaitable[tuple[dict[str, Any], bool]]]],
    token_getter: Callable[[], str],
) -> None:
    install_observability(app, service)

    @app.exception_handler(EngramError)
    async def engram_error(_request: Request, exc: EngramError) -> JSONResponse:
        return JSONResponse({"error": exc.to_wire()}, status_code=exc.http_status)

    @app.post("/v1/tools/{name}")
    async def call_tool(name: str, body: ToolRequest, request: Request) -> JSONResponse:
        supplied = request.headers.get(SERVICE_TOKEN_HEADER, "")
        if not hmac.compare_digest(supplied.encode(), token_getter().encode()):
            return JSONResponse({"error": {"code": -32600, "message": "unauthorized caller"}}, status_code=401)
        handler = handlers.get(name)
        if handler is None:
            return JSONResponse({"error": {"code": -32601, "message": f"Unknown tool: {name}"}}, status_code=404)
        session = body.session or {}
        ctx = ToolContext(
            principal=Principal.from_wire(body.principal),
            session_id=session.get("id"),
            transport_id=session.get("transport_id"),
        )
        started = time.perf_counter()
        try:
            try:
                result, is_error = await handler(request, ctx, body.arguments)
            except asyncpg.ForeignKeyViolationError as exc:
                # Only a row of a key deleted meanwhile can miss its api_keys parent.
                if ctx.principal.key_id is None or "api_keys" not in (exc.detail or ""):
                    raise
                raise CredentialGone("Unauthorized: this API key has been deleted") from None
        except EngramError as exc:
            TOOL_CALLS.labels(service, name, "error").inc()
            elapsed_ms = (time.perf_counter() - started) * 1000
            logger.info("tool %s error %s in %.1f ms (key %s)", name, exc.code, elapsed_ms, ctx.principal.key_id)
            raise
        outcome = "tool_error" if is_error else "ok"
        TOOL_CALLS.labels(service, name, outcome).inc()
        # One line per call: the log format carries the trace id and correlation id.
        logger.info("tool %s %s in %.1f ms (key %s)", name, outcome, (time.perf_counter() - started) * 1000, ctx.principal.key_id)
        return JSONResponse({"result": result, "isError": is_error})
