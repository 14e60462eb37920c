"""The internal RPC contract between the gateway and recall / ingest.

`POST /v1/tools/{name}` with `{"arguments", "principal", "session"}`; the reply is
`{"result", "isError"}` or, for a protocol error, an HTTP 4xx/5xx with `{"error": {code,
message, data}}` that the gateway turns back into the same JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.rpc import SERVICE_TOKEN_HEADER, TIMEOUT_HEADER
from shared.contract.base import problems
from shared.db import ping
from shared.domain.errors import CredentialGone, EngramError, InvalidParams
from shared.domain.principal import Principal
from shared.metrics import DEPENDENCY_UP, OTHER, count_error, observe_pool, tool_timers
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
    # When the caller stops waiting for the reply, on the event loop's clock (its
    # TIMEOUT_HEADER on arrival); None when it did not say.
    deadline: float | None = None


def caller_deadline(header: str | None) -> float | None:
    """TIMEOUT_HEADER's milliseconds from now on the event loop's clock; None when it is
    absent or not a positive whole number."""
    if header is None or not header.isdigit() or int(header) <= 0:
        return None
    return asyncio.get_running_loop().time() + int(header) / 1000


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


# FastAPI's own OpenTelemetry middleware would be a second server span (and histogram) per
# request beside _Observe's: every app passes this to FastAPI(telemetry=...).
NATIVE_TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
# Where _Observe leaves the request's trace context and correlation id in the ASGI scope, for
# handlers that run in another task (the MCP SDK dispatches messages in its session's task
# group, which does not inherit the request's context).
TRACE_SCOPE_KEY = "engram.trace_context"
CORRELATION_SCOPE_KEY = "engram.correlation_id"
_TRACE_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate", CORRELATION_HEADER.encode(): CORRELATION_HEADER}
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# A path no route serves (a scanner's probe): one label, never the path itself.
UNMATCHED = "unmatched"


class _Observe:
    """The one server span per request, correlation id, HTTP metrics: plain ASGI, since
    Starlette's BaseHTTPMiddleware runs every request through an extra task and memory
    streams (recall spent 2.1 vs 1.4 ms of CPU per internal tool call, bench/gateway_bench.py's
    direct case). Routes are labelled by their template (`/v1/tools/{name}`), so the label set
    is the route table plus "unmatched"."""

    def __init__(self, app: ASGIApp, service: str, router: Router) -> None:
        self.app = app
        self.service = service
        self.router = router
        self.tracer = trace.get_tracer(f"engram.{service}")

    def route_label(self, scope: Scope) -> str:
        path = getattr(scope.get("route"), "path", None)
        if path is not None:
            return str(path) or "/"
        # Refused before routing (413, 429, 401 at the front door): the route it was for.
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                return str(getattr(route, "path", UNMATCHED)) or "/"
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        for key, value in scope["headers"]:
            name = _TRACE_HEADERS.get(key)
            if name is not None:
                carrier[name] = value.decode("latin-1")
        cid = carrier.get(CORRELATION_HEADER) or new_correlation_id()
        correlation_id.set(cid)
        method = scope["method"] if scope["method"] in _METHODS else "OTHER"
        status = 500
        latency_seen = False
        start = time.perf_counter()

        async def observed(message: Message) -> None:
            nonlocal status, latency_seen
            if message["type"] == "http.response.start":
                status = message["status"]
                # Time to the response's start, as before: a stream's length is not latency.
                HTTP_LATENCY.labels(self.service, self.route_label(scope)).observe(time.perf_counter() - start)
                latency_seen = True
            await send(message)

        parent = extract_context(carrier) if "traceparent" in carrier else None
        with self.tracer.start_as_current_span(method, context=parent, kind=trace.SpanKind.SERVER) as span:
            scope[TRACE_SCOPE_KEY] = otel_context.get_current()
            scope[CORRELATION_SCOPE_KEY] = cid
            try:
                await self.app(scope, receive, observed)
            finally:
                route = self.route_label(scope)
                if not latency_seen:
                    HTTP_LATENCY.labels(self.service, route).observe(time.perf_counter() - start)
                HTTP_REQUESTS.labels(self.service, route, str(status)).inc()
                span.update_name(f"{method} {route}")
                span.set_attribute("http.request.method", method)
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(trace.StatusCode.ERROR)


class ObservedResources(Protocol):
    """What /metrics reads at scrape time: the process's pool and (optional) Redis client."""

    pool: asyncpg.Pool
    redis: Any


# A scrape answers within Prometheus' 10 s timeout even when a dependency hangs.
PROBE_SECONDS = 1.0


async def observe_dependencies(service: str, resources: ObservedResources) -> None:
    pool = resources.pool
    observe_pool(service, pool)
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            await ping(pool)
        DEPENDENCY_UP.labels(service, "postgres").set(1)
    except TimeoutError:
        # Every connection lent out and none free in time: a busy pool (engram_db_pool_waiting
        # says so), not a Postgres that is away; the last answer stands. A Postgres that hangs
        # fails its connections' commands within command_timeout and its reconnects within 5 s.
        if pool.get_idle_size() or pool.get_size() < pool.get_max_size():
            DEPENDENCY_UP.labels(service, "postgres").set(0)
    except Exception:  # noqa: BLE001 - a probe: any failure means "not reached"
        DEPENDENCY_UP.labels(service, "postgres").set(0)
    if resources.redis is None:
        return
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            await resources.redis.ping()
        DEPENDENCY_UP.labels(service, "redis").set(1)
    except Exception:  # noqa: BLE001 - a probe: any failure means "not reached"
        DEPENDENCY_UP.labels(service, "redis").set(0)


def install_observability(
    app: FastAPI, service: str, resources: Callable[[FastAPI], ObservedResources | None] | None = None,
) -> None:
    """Trace context in, correlation id, HTTP metrics and GET /metrics, for every service.
    `resources` gives /metrics the pool and Redis to report on (pool saturation, reachability)."""
    app.add_middleware(_Observe, service=service, router=app.router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        observed = _resources_of(request.app, resources)
        if observed is not None:
            await observe_dependencies(service, observed)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def _resources_of(app: FastAPI, resources: Callable[[FastAPI], ObservedResources | None] | None) -> ObservedResources | None:
    if resources is None:
        return None
    try:
        return resources(app)
    except AttributeError:  # scraped before the lifespan built them
        return None


def _app_resources(app: FastAPI) -> ObservedResources | None:
    return getattr(app.state, "resources", None)


def install_internal_api(
    app: FastAPI,
    service: str,
    handlers: dict[str, Callable[[Request, ToolContext, dict[str, Any]], Awaitable[tuple[dict[str, Any], bool]]]],
    token_getter: Callable[[], str],
) -> None:
    install_observability(app, service, _app_resources)
    timers = tool_timers(service)

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
            deadline=caller_deadline(request.headers.get(TIMEOUT_HEADER)),
        )
        started = time.perf_counter()
        timer = timers.get(name) or timers[OTHER]
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
            count_error(service, name, exc)
            elapsed_ms = (time.perf_counter() - started) * 1000
            logger.info("tool %s error %s in %.1f ms (key %s)", name, exc.code, elapsed_ms, ctx.principal.key_id)
            raise
        except Exception as exc:
            count_error(service, name, exc)
            raise
        finally:
            timer.observe(time.perf_counter() - started)
        outcome = "tool_error" if is_error else "ok"
        TOOL_CALLS.labels(service, name, outcome).inc()
        # One line per call: the log format carries the trace id and correlation id.
        logger.info("tool %s %s in %.1f ms (key %s)", name, outcome, (time.perf_counter() - started) * 1000, ctx.principal.key_id)
        return JSONResponse({"result": result, "isError": is_error})
