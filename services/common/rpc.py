"""The one client of the internal RPC (services/common/internal.py is its server side):
`POST {replica}/v1/tools/{name}` carrying the service token, the W3C traceparent and the
correlation id, answering (result, isError) or raising the error the service replied.

Used by the gateway (forwarding tool calls to recall and ingest) and by the maintenance
worker (AutoReflect's reflect and link calls, the batch queue's chunks to ingest). A service
may have several replicas (recall runs N): calls go round robin and a replica that refuses
the connection is skipped. Anything that means "the service did not answer" (no replica
reachable, a timeout or reset after the request went out, a reply that is not ours) is
`Unavailable`, which every surface turns into a 503 / a retry.

aiohttp rather than httpx / httpx2: its request and response are parsed by compiled code
(multidict, yarl, the C HTTP parser), where httpx2 walks every header through
httpcore2 and h11 in Python. One POST of a forwarded tool call to a local JSON echo cost the
client 230-290 us of CPU against 760-950 us with httpx2, interleaved in the same minutes; on
the gateway that was the largest single part of a forwarded call (bench/README.md, "The
gateway's cost per call")."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

import aiohttp
from cachetools import TTLCache
from opentelemetry import trace

from shared.domain.errors import EngramError, InvalidParams, PolicyViolation, Unavailable
from shared.domain.principal import Principal
from shared.telemetry import inject_headers

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer("engram.rpc")

# The shared secret's header, checked by the server side (services/common/internal.py). Named
# here, in the module without a web framework, so the Celery worker can call without one.
SERVICE_TOKEN_HEADER = "x-engram-service-token"  # noqa: S105 - a header name, not a secret
# How long the caller waits for this reply, in milliseconds (the client's read timeout): a
# service that cannot start the work in time sheds it instead of doing it for nobody.
TIMEOUT_HEADER = "x-engram-timeout-ms"
# A replica that does not accept the connection within this long is skipped for the next.
CONNECT_SECONDS = 2.0
# A replica that is refused at once costs nothing; one that does not answer its /health within
# this long is not serving tool calls either. /health stays inside the readiness probe's 3 s.
HEALTH_PROBE_SECONDS = 1.0
# Probes every few seconds from each kubelet and load balancer are answered from one round of
# replica probes per this interval.
HEALTH_CACHE_SECONDS = 2.0
# The request never reached a replica (refused, no route, the TCP connect timed out): the next
# replica may take it. Anything else after the request went out fails the call.
CONNECT_FAILED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
CALL_FAILED = (aiohttp.ClientError, asyncio.TimeoutError)
# Below uvicorn's --timeout-keep-alive default of 5 s.
KEEPALIVE_SECONDS = 4.0
# Per service: every replica answers "ok"; some do ("degraded"); none does ("down").
ServiceStatus = Literal["ok", "degraded", "down"]


class UpstreamError(EngramError):
    """An error reply from an internal service, carried back with its JSON-RPC code."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message, data)
        self.code = code


def _error_from(status: int, body: dict[str, Any]) -> EngramError:
    error = body.get("error") or {}
    code = int(error.get("code", -32603))
    message = str(error.get("message", "upstream error"))
    if status == 503:
        # The service is there but cannot answer now (a search shed at its caller's deadline,
        # a dependency it lacks): every surface answers 503 with Retry-After, as for one down.
        return Unavailable(message, error.get("data"))
    if code == InvalidParams.code:
        return InvalidParams(message, error.get("data"))
    if code == PolicyViolation.code:
        return PolicyViolation(message, error.get("data"))
    return UpstreamError(code, message, error.get("data"))


class InternalClient:
    """Pooled keep-alive client of the internal services. `urls` maps a service name
    ("recall", "ingest") to its replicas' base URLs."""

    def __init__(
        self, urls: dict[str, list[str]], service_token: str, timeout: float, *,
        max_connections: int = 200,
    ) -> None:
        self._urls = {name: [u.rstrip("/") for u in replicas] for name, replicas in urls.items()}
        self._cursor: dict[str, Iterator[int]] = {
            name: itertools.cycle(range(len(replicas))) for name, replicas in self._urls.items()
        }
        self._token = service_token
        # As httpx's Timeout(timeout, connect=...): the TCP connect is bounded by CONNECT_SECONDS,
        # a wait for a pooled connection and each read by `timeout`; the whole call is not.
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=min(CONNECT_SECONDS, timeout), sock_read=timeout
        )
        self._timeout_ms = str(int(timeout * 1000))
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._health: TTLCache[str, dict[str, Any]] = TTLCache(1, HEALTH_CACHE_SECONDS)

    @property
    def http(self) -> aiohttp.ClientSession:
        """The pooled session, made on first use inside the running event loop (aiohttp binds a
        session to its loop; the worker's clients are made outside one)."""
        if self._session is None:
            # Idle connections are closed before the services' uvicorn drops them (its keep-alive
            # is 5 s), so a call never goes out on a connection the server is closing.
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, json_serialize=json.dumps,
                # Upstream replies are small JSON; no cookies between internal services.
                cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            )
        return self._session

    @staticmethod
    def replicas(setting: str) -> list[str]:
        """A URL setting's replicas: comma-separated, as RECALL_URL / INGEST_URL are written."""
        return [u.strip() for u in setting.split(",") if u.strip()]

    def urls(self, service: str) -> list[str]:
        return self._urls[service]

    async def call(
        self, service: str, tool: str, arguments: dict[str, Any], principal: Principal | dict[str, Any],
        session: dict[str, Any] | None,
    ) -> tuple[dict[str, Any], bool]:
        """The tool's result and whether it answered isError. Raises the service's error
        reply as an EngramError, and Unavailable when no replica answered."""
        urls = self._urls[service]
        start = next(self._cursor[service])
        wire = principal.to_wire() if isinstance(principal, Principal) else principal
        payload = {"arguments": arguments, "principal": wire, "session": session}
        # The internal hop's CLIENT span; the service's server span is its child.
        with _tracer.start_as_current_span(f"POST {service} /v1/tools/{{name}}", kind=trace.SpanKind.CLIENT) as span:
            span.set_attribute("engram.tool", tool)
            headers = inject_headers({SERVICE_TOKEN_HEADER: self._token, TIMEOUT_HEADER: self._timeout_ms})
            return await self._call(service, tool, urls, start, payload, headers)

    async def _call(
        self, service: str, tool: str, urls: list[str], start: int, payload: dict[str, Any], headers: dict[str, str],
    ) -> tuple[dict[str, Any], bool]:
        last_error: Exception | None = None
        # Round robin over replicas; a replica that refuses the connection is skipped.
        for attempt in range(len(urls)):
            url = urls[(start + attempt) % len(urls)]
            try:
                async with self.http.post(f"{url}/v1/tools/{tool}", json=payload, headers=headers) as response:
                    status, raw = response.status, await response.read()
            except CONNECT_FAILED as exc:
                last_error = exc
                logger.warning("%s replica %s unreachable", service, url)
                continue
            except CALL_FAILED as exc:  # a read timeout, a reset: the replica took the call and failed
                raise Unavailable(f"{service} service unavailable ({exc.__class__.__name__})") from exc
            try:
                body = json.loads(raw)
            except ValueError:  # not our JSON reply: a crash page, a proxy's error
                logger.warning("%s replica %s answered HTTP %s without a JSON body", service, url, status)
                raise Unavailable(f"{service} service error: HTTP {status}") from None
            if status >= 400 or "error" in body:
                raise _error_from(status, body)
            return body["result"], bool(body.get("isError"))
        reason = f" ({last_error.__class__.__name__})" if last_error is not None else ""
        raise Unavailable(f"{service} service unavailable{reason}") from last_error

    async def health(self) -> dict[str, Any]:
        """Each replica's /health, probed concurrently: url -> {service, status[, error]}."""
        cached = self._health.get("report")
        if cached is not None:
            return cached
        targets = [(service, url) for service, urls in self._urls.items() for url in urls]
        probes = await asyncio.gather(*(self._probe(service, url) for service, url in targets))
        report = {url: probe for (_, url), probe in zip(targets, probes, strict=True)}
        self._health["report"] = report
        return report

    async def _probe(self, service: str, url: str) -> dict[str, Any]:
        try:
            async with self.http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=HEALTH_PROBE_SECONDS)) as response:
                status = response.status
        except CALL_FAILED as exc:
            return {"service": service, "status": "down", "error": exc.__class__.__name__}
        return {"service": service, "status": "ok" if status == 200 else "degraded"}

    @staticmethod
    def service_status(report: dict[str, Any]) -> dict[str, ServiceStatus]:
        """Per service from the replica report: "ok", "degraded" (some replicas not ok) or
        "down" (no replica ok: its tools cannot be served)."""
        by_service: dict[str, list[str]] = {}
        for info in report.values():
            by_service.setdefault(info["service"], []).append(info["status"])
        status: dict[str, ServiceStatus] = {}
        for service, replicas in by_service.items():
            ok = replicas.count("ok")
            status[service] = "ok" if ok == len(replicas) else "degraded" if ok else "down"
        return status

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> InternalClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        await self.aclose()
