"""Any gateway replica serves any Streamable HTTP request (issue 16): three gateway processes
on one session store (one Redis database), and each request of one MCP session goes to a
different replica; a replica killed mid-session takes nothing of the session with it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from services.stack.supervisor import ServiceProcess, Stack
from tests.gateway.conftest import Gateway, start_gateway
from tests.gateway.wire import RawMcp, db, rpc_body
from tests.support import call, create_api_key, unique

# A Redis database no other gateway of the test session uses: these three share it.
SHARED_REDIS_DB = 5
ADMIN = "/v1/internal/model/nothing"


@pytest.fixture(scope="module")
def replicas(stack: Stack) -> Iterator[list[tuple[ServiceProcess, Gateway]]]:
    started = [start_gateway(stack, f"gateway-{name}", SHARED_REDIS_DB, {}) for name in ("a", "b", "c")]
    yield started
    for proc, _ in started:
        proc.stop()


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next replica in turn, as a load balancer without affinity
    does, and remembers which replica served what."""

    def __init__(self, urls: list[str]) -> None:
        self.ports = [httpx2.URL(u).port for u in urls]
        self.inner = httpx2.AsyncHTTPTransport()
        self.turn = 0
        self.served: list[tuple[str, int]] = []

    def drop(self, port: int) -> None:
        self.ports.remove(port)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[self.turn % len(self.ports)]
        self.turn += 1
        request.url = request.url.copy_with(port=port)
        self.served.append((request.method, port))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def active(session: ClientSession) -> dict[str, Any]:
    return json.loads((await session.read_resource("memory://active-session")).contents[0].text)


async def raw_active(mcp: RawMcp) -> dict[str, Any]:
    return json.loads((await mcp.rpc("resources/read", {"uri": "memory://active-session"}))["result"]["contents"][0]["text"])


FACTS = [
    "the canary stage waits ten minutes of clean error rates",
    "database migrations run before the new pods take traffic",
    "the on-call engineer approves every production rollback",
    "feature flags default to off in the staging cluster",
]


def note(ws: str, n: int) -> dict[str, Any]:
    return {"content": f"Deploy rule {n} in {ws}: {FACTS[n]}.", "topic": "replicas", "type": "fact", "workspace": ws}


async def test_raw_requests_of_one_session_on_three_replicas(stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]) -> None:
    a, b, c = (g for _, g in replicas)
    raw, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, a.mcp_url, raw)
        await mcp.initialize()  # A
        mcp.url = b.mcp_url
        stored = await mcp.tool("remember", note(ws, 0) | {"content": f"Deploy rule 1 in {ws}: {FACTS[0]}."})  # B
        assert not stored["result"].get("isError"), stored
        mcp.url = c.mcp_url
        found = await mcp.tool("recall", {"keywords": ["canary"], "workspace": ws})  # C
        assert "Deploy rule 1" in json.dumps(found)
        info = await raw_active(mcp)
        assert info["sessionId"] == mcp.session_id and [x["tool"] for x in info["activity"]] == ["remember", "recall"]
        headers = {**mcp._headers(), "Accept": "text/event-stream"}  # noqa: SLF001
        async with http.stream("GET", c.mcp_url, headers=headers) as stream:  # C
            assert stream.status_code == 200 and stream.headers["mcp-session-id"] == mcp.session_id
        # the stream and DELETE, served by the gateway itself, keep the SDK's DNS rebinding checks
        rebound = {**headers, "Origin": "http://evil.example"}
        assert (await http.get(c.mcp_url, headers=rebound)).status_code == 403
        assert (await http.delete(c.mcp_url, headers={**mcp._headers(), "Host": "evil.example"})).status_code == 421  # noqa: SLF001
        assert (await mcp.delete()).status_code == 200  # C
        for gateway in (a, b, c):  # ended on every replica
            mcp.url = gateway.mcp_url
            assert (await mcp.request("ping")).status_code == 404
    async with db(stack) as conn:
        row = await conn.fetchrow("SELECT key_id, end_reason FROM sessions WHERE id = $1", info["segmentId"])
    assert row["key_id"] == key_id and row["end_reason"] == "client_delete"


async def test_rotate_on_one_replica_new_id_on_another(stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]) -> None:
    a, b, _ = (g for _, g in replicas)
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, a.mcp_url, raw)
        await mcp.initialize()
        old = mcp.session_id
        reply = await http.post(f"{a.url}/session/rotate", headers={**mcp._headers(), "Origin": "http://localhost"})  # noqa: SLF001
        assert reply.status_code == 200, reply.text
        new = reply.json()["newSessionId"]
        mcp.url, mcp.session_id = b.mcp_url, new
        info = await raw_active(mcp)
        assert info["sessionId"] == new and info["segmentId"] == f"{new}#1"
        # the id it replaced works on any replica with the session's credential only
        mcp.session_id = old
        assert (await mcp.request("ping")).status_code == 200
        bare = {k: v for k, v in mcp._headers().items() if k != "Authorization"}  # noqa: SLF001
        assert (await http.post(b.mcp_url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=bare)).status_code == 401
        mcp.session_id = new
        assert (await mcp.delete()).status_code == 200


async def test_token_based_reuse_across_replicas(stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]) -> None:
    a, b, c = (g for _, g in replicas)
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http:
        first = RawMcp(http, a.mcp_url, raw)
        await first.initialize()
        await first.tool("memory_stats", {})
        logical = await raw_active(first)
        # the client's GET stream opens and closes on B: it has gone away
        headers = {**first._headers(), "Accept": "text/event-stream"}  # noqa: SLF001
        async with http.stream("GET", b.mcp_url, headers=headers) as stream:
            assert stream.status_code == 200
        again = RawMcp(http, c.mcp_url, raw)
        await again.initialize()
        info = await raw_active(again)
        assert info["sessionId"] == logical["sessionId"] and info["segmentId"] == logical["segmentId"]
        assert [x["tool"] for x in info["activity"]] == ["memory_stats"]
        first.url = b.mcp_url  # the client id it took over is over, on every replica
        assert (await first.request("ping")).status_code == 404
        # a request of the Bearer without a session id reaches its session on any replica
        bare = await http.post(a.mcp_url, json={"jsonrpc": "2.0", "id": 5, "method": "resources/read",
                                               "params": {"uri": "memory://active-session"}},
                               headers={**again.headers, "mcp-protocol-version": "2025-06-18"})
        assert json.loads(rpc_body(bare)["result"]["contents"][0]["text"])["sessionId"] == logical["sessionId"]
        assert (await again.delete()).status_code == 200


async def test_a_revoked_keys_session_is_refused_on_every_replica(stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]) -> None:
    a, b, c = (g for _, g in replicas)
    master = {"Authorization": f"Bearer {stack.master_key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.post(f"{a.url}{ADMIN}/keys", json={"name": unique("rep")}, headers=master)
        assert made.status_code == 201, made.text
        raw, key_id = made.json()["raw_key"], made.json()["id"]
        mcp = RawMcp(http, a.mcp_url, raw)
        await mcp.initialize()
        assert (await mcp.request("ping")).status_code == 200
        reply = await http.put(f"{b.url}{ADMIN}/keys/{key_id}", json={"status": "inactive"}, headers=master)
        assert reply.status_code == 200, reply.text
        bare = {k: v for k, v in mcp._headers().items() if k != "Authorization"}  # noqa: SLF001
        for gateway in (c, b, a):
            response = await http.post(gateway.mcp_url, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers=bare)
            assert response.status_code in (401, 404), (gateway.url, response.status_code, response.text)
            mcp.url = gateway.mcp_url
            assert (await mcp.request("ping")).status_code == 401


async def test_legacy_sse_messages_reach_the_replica_holding_the_stream(
    stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]
) -> None:
    """A legacy SSE stream stays on the replica that opened it; a POST /message that lands on
    another replica is forwarded there, and its reply comes down the stream."""
    a, b, c = (g for _, g in replicas)
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as http, http.stream("GET", f"{a.url}/sse?accessKey={raw}") as stream:
        lines = stream.aiter_lines()
        endpoint = ""
        async for line in lines:
            if line.startswith("data:"):
                endpoint = line[5:].strip()
                break
        assert endpoint.startswith("/message?sessionId=")

        async def reply() -> dict[str, Any]:
            async for line in lines:
                if line.startswith("data:"):
                    return dict(json.loads(line[5:]))
            raise AssertionError("the stream ended")

        headers = {"Content-Type": "application/json"}  # seed: POST /message carries no credential
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-sse", "version": "1"}}}
        assert (await http.post(f"{b.url}{endpoint}", json=init, headers=headers)).status_code == 202  # B -> A
        assert "result" in await reply()
        await http.post(f"{c.url}{endpoint}", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        read = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "memory://active-session"}}
        assert (await http.post(f"{c.url}{endpoint}", json=read, headers=headers)).status_code == 202  # C -> A
        info = json.loads((await reply())["result"]["contents"][0]["text"])
        assert info["transport"] == "sse" and info["keyId"] == key_id
        # another key's credential is refused on a replica that does not hold the stream too
        other, _ = await create_api_key(stack.database_url)
        foreign = await http.post(f"{b.url}{endpoint}", json=read, headers={**headers, "Authorization": f"Bearer {other}"})
        assert foreign.status_code == 403


async def test_sdk_client_over_three_replicas_survives_losing_one(stack: Stack, replicas: list[tuple[ServiceProcess, Gateway]]) -> None:
    """Last in this file: it kills a replica."""
    raw, _ = await create_api_key(stack.database_url)
    ws = unique()
    urls = [g.url for _, g in replicas]
    balancer = RoundRobin(urls)
    async with httpx2.AsyncClient(transport=balancer, headers={"Authorization": f"Bearer {raw}"}, timeout=60) as http:
        async with streamable_http_client(replicas[0][1].mcp_url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                ids = [(await call(session, "remember", note(ws, n)))["id"] for n in range(3)]
                before = await active(session)
                assert before["transportId"] and [x["tool"] for x in before["activity"]] == ["remember"] * 3
                assert len({port for _, port in balancer.served}) == 3  # every replica served the session
                # kill -9 the replica that served the last request; the balancer stops sending to it
                last = balancer.served[-1][1]
                victim = next(proc for proc, g in replicas if httpx2.URL(g.url).port == last)
                victim.signal(signal.SIGKILL)
                balancer.drop(last)
                ids.append((await call(session, "remember", note(ws, 3)))["id"])
                after = await active(session)
                assert after["sessionId"] == before["sessionId"] and after["segmentId"] == before["segmentId"]
                assert [x["tool"] for x in after["activity"]] == ["remember"] * 4
                # what was written before the replica died is there, read through a survivor
                found = await call(session, "recall", {"keywords": ["canary"], "workspace": ws})
                assert ids[0] in {f["id"] for f in found["fragments"]}
    async with db(stack) as conn:
        rows = await conn.fetch("SELECT session_id FROM fragments WHERE id = ANY($1::text[])", ids)
    assert len(rows) == 4 and {r["session_id"] for r in rows} == {before["segmentId"]}
