"""The one client of the internal RPC (services/common/internal.py is its server side):
`POST {replica}/v1/tools/{name}` carrying the service token, the W3C traceparent and the
correlation id, answering (result, isError) or raising the error the service replied.

Used by the gateway (forwarding tool calls to recall and ingest) and by the maintenance
worker (AutoReflect's reflect and link calls, the batch queue's chunks to ingest). A service
may have several replicas (recall runs N): calls go round robin and a replica that refuses
the connection is skipped. Anything that means "the service did not answer" (no replica
reachable, a timeout or reset after the request went out, a reply that is not ours) is
`Unavailable`, which every surface turns into a 503 / a retry.

httpx2 (the MCP SDK's client) rather than httpx: httpcore 1.x tries `import sniffio` on every
request, a failed import when sniffio is absent; measured 0.9 vs 1.4 ms of client CPU per
call (bench/gateway_bench.py's direct case, same machine, same moment)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

import httpx2
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
# A replica that does not accept the connection within this long is skipped for the next.
CONNECT_SECONDS = 2.0
# A replica that is refused at once costs nothing; one that does not answer its /health within
# this long is not serving tool calls either. /health stays inside the readiness probe's 3 s.
HEALTH_PROBE_SECONDS = 1.0
# Probes every few seconds from each kubelet and load balancer are answered from one round of
# replica probes per this interval.
HEALTH_CACHE_SECONDS = 2.0
# Per service: every replica answers "ok"; some do ("degraded"); none does ("down").
ServiceStatus = Literal["ok", "degraded", "down"]


class UpstreamError(EngramError):
    """An error reply from an internal service, carried back with its JSON-RPC code."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message, data)
        self.code = code


def _error_from(body: dict[str, Any]) -> EngramError:
    error = body.get("error") or {}
    code = int(error.get("code", -32603))
    message = str(error.get("message", "upstream error"))
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
        max_connections: int = 200, max_keepalive: int = 50,
    ) -> None:
        self._urls = {name: [u.rstrip("/") for u in replicas] for name, replicas in urls.items()}
        self._cursor: dict[str, Iterator[int]] = {
            name: itertools.cycle(range(len(replicas))) for name, replicas in self._urls.items()
        }
        self._token = service_token
        self.http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout, connect=min(CONNECT_SECONDS, timeout)),
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive),
        )
        self._health: TTLCache[str, dict[str, Any]] = TTLCache(1, HEALTH_CACHE_SECONDS)

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
            headers = inject_headers({SERVICE_TOKEN_HEADER: self._token})
            return await self._call(service, tool, urls, start, payload, headers)

    async def _call(
        self, service: str, tool: str, urls: list[str], start: int, payload: dict[str, Any], headers: dict[str, str],
    ) -> tuple[dict[str, Any], bool]:
        last_error: Exception | None = None
        # Round robin over replicas; a replica that refuses the connection is skipped.
        for attempt in range(len(urls)):
            url = urls[(start + attempt) % len(urls)]
            try:
                response = await self.http.post(f"{url}/v1/tools/{tool}", json=payload, headers=headers)
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
                last_error = exc
                logger.warning("%s replica %s unreachable", service, url)
                continue
            except httpx2.HTTPError as exc:  # a read timeout, a reset: the replica took the call and failed
                raise Unavailable(f"{service} service unavailable ({exc.__class__.__name__})") from exc
            try:
                body = response.json()
            except ValueError:  # not our JSON reply: a crash page, a proxy's error
                logger.warning("%s replica %s answered HTTP %s without a JSON body", service, url, response.status_code)
                raise Unavailable(f"{service} service error: HTTP {response.status_code}") from None
            if response.status_code >= 400 or "error" in body:
                raise _error_from(body)
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
            response = await self.http.get(f"{url}/health", timeout=HEALTH_PROBE_SECONDS)
        except httpx2.HTTPError as exc:
            return {"service": service, "status": "down", "error": exc.__class__.__name__}
        return {"service": service, "status": "ok" if response.status_code == 200 else "degraded"}

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
        await self.http.aclose()

    async def __aenter__(self) -> InternalClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        await self.aclose()
