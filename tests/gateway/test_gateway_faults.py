"""Dependencies failing under the gateway (issue 15, finding 4): Postgres gone answers 503 with
Retry-After (JSON on HTTP routes, a JSON-RPC error on /mcp), never a bare 500; recall or ingest
down or hanging gives a tool call a JSON-RPC error saying the service is unavailable, and
/health names the service that is down. Each on a gateway process of its own, so the shared
stack keeps its database and services."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from services.stack.supervisor import Stack, free_port
from tests.gateway.conftest import Gateway, start_gateway
from tests.gateway.wire import RawMcp, rpc_body
from tests.support import create_api_key, unique


class TcpRelay:
    """A TCP relay in front of Postgres for one gateway: cut() takes the database away from
    that gateway alone (the port refuses, every relayed connection drops)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()
        self.listener.close()
        with self._lock:
            for end in self._sockets:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


@pytest.fixture
def relay(stack: Stack) -> Iterator[TcpRelay]:
    url = urlsplit(stack.database_url)
    relay = TcpRelay(url.hostname or "127.0.0.1", url.port or 5432)
    yield relay
    relay.cut()


@pytest.fixture
def relayed_gateway(stack: Stack, relay: TcpRelay) -> Iterator[Gateway]:
    """A gateway whose Postgres is reached through `relay`; recall and ingest are the stack's."""
    url = urlsplit(stack.database_url)
    netloc = url.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{relay.port}"
    relayed = urlunsplit(url._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))
    proc, gateway = start_gateway(stack, "gateway-pg-relay", 7, {"DATABASE_URL": relayed})
    yield gateway
    proc.stop()


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.fixture
def orphan_gateway(stack: Stack, black_hole: str) -> Iterator[Gateway]:
    """A gateway whose recall hangs (accepts, never answers) and whose ingest refuses connections."""
    proc, gateway = start_gateway(
        stack, "gateway-orphan", 8,
        {"RECALL_URL": black_hole, "INGEST_URL": f"http://127.0.0.1:{free_port()}", "UPSTREAM_TIMEOUT": "PT2S"},
        require_healthy=False,
    )
    yield gateway
    proc.stop()


def unavailable(response: httpx.Response) -> dict[str, Any]:
    """A 503 that says to retry, as JSON: never a bare 500 or a text page."""
    assert response.status_code == 503, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert int(response.headers["retry-after"]) > 0
    body: dict[str, Any] = response.json()
    return body


async def test_postgres_gone_answers_503_with_retry_after(stack: Stack, relay: TcpRelay, relayed_gateway: Gateway) -> None:
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        master = RawMcp(http, relayed_gateway.mcp_url, stack.master_key)
        await master.initialize()  # a session opened while the database was there

        relay.cut()

        # An API-key call: the key cannot be looked up.
        tenant = RawMcp(http, relayed_gateway.mcp_url, raw)
        error = unavailable(await http.post(tenant.url, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        }, headers=tenant.headers))["error"]
        assert error["code"] == -32603 and "unavailable" in error["message"]
        # The admin REST API: JSON with the reason.
        admin = await http.get(f"{relayed_gateway.url}/v1/internal/model/nothing/keys", headers={"Authorization": f"Bearer {stack.master_key}"})
        assert unavailable(admin)["error"] == "Service Unavailable"
        # Inside an open session, a resource the gateway reads from Postgres: a JSON-RPC error
        # that says what is down (not the SDK's code 0 with an exception's text).
        topics = await master.request("resources/read", {"uri": "memory://topics"})
        assert topics.status_code == 200
        failed = rpc_body(topics)["error"]
        assert failed["code"] == -32603 and "database unavailable" in failed["message"]
        health = await http.get(f"{relayed_gateway.url}/health")
        assert health.status_code == 503 and health.json()["checks"]["database"]["status"] == "down"


async def test_dead_services_are_reported_and_refused_as_unavailable(stack: Stack, orphan_gateway: Gateway) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        health = await http.get(f"{orphan_gateway.url}/health")
        assert health.status_code == 503, health.text
        body = health.json()
        assert body["status"] == "degraded" and body["services"] == {"recall": "down", "ingest": "down"}
        assert body["checks"]["database"]["status"] == "ok"
        # Liveness does not depend on them: restarting the gateway would cure nothing.
        assert (await http.get(f"{orphan_gateway.url}/health/live")).status_code == 200

        mcp = RawMcp(http, orphan_gateway.mcp_url, stack.master_key)
        await mcp.initialize()
        ws = unique()
        stored = await mcp.tool("remember", {"content": "The pager rota changes on Mondays.", "topic": "oncall", "type": "fact", "workspace": ws})
        assert stored["error"]["code"] == -32603 and "ingest service unavailable" in stored["error"]["message"]
        # recall accepts the connection and never answers: the call ends at UPSTREAM_TIMEOUT.
        found = await mcp.tool("recall", {"keywords": ["pager"], "workspace": ws})
        assert found["error"]["code"] == -32603 and "recall service unavailable" in found["error"]["message"]
