"""The one internal RPC client (services/common/rpc.py) against the real recall and ingest:
what the gateway and the maintenance worker rely on when they call them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from services.common.internal import ToolContext, install_internal_api
from services.common.rpc import SERVICE_TOKEN_HEADER, TIMEOUT_HEADER, InternalClient, UpstreamError
from services.stack.supervisor import free_port
from shared.domain.errors import InvalidParams, Unavailable
from shared.domain.principal import Principal
from shared.telemetry import correlation_id
from tests.support import Stack, unique


async def test_a_dead_replica_is_skipped_on_every_turn_of_the_round_robin(stack: Stack) -> None:
    """AutoReflect used to call only the first INGEST_URL; a dead first replica is now
    skipped, wherever the round robin starts."""
    dead = f"http://127.0.0.1:{free_port()}"
    async with InternalClient({"recall": [dead, *stack.recall_urls]}, stack.service_token, 30) as client:
        for _ in range(len(stack.recall_urls) + 1):
            result, is_error = await client.call("recall", "memory_stats", {}, Principal.master(), None)
            assert is_error is False and "totalFragments" in result["stats"]


async def test_no_replica_answering_is_unavailable(stack: Stack) -> None:
    """What every caller turns into a retry (a 503 at the gateway, a task retry in the worker)."""
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    async with InternalClient({"ingest": dead}, stack.service_token, 30) as client:
        with pytest.raises(Unavailable, match="ingest service unavailable"):
            await client.call("ingest", "remember", {"content": "x", "topic": "t", "type": "fact"}, Principal.master(), None)


async def test_the_services_errors_come_back_as_ours(stack: Stack) -> None:
    """A refused argument is InvalidParams (the gateway answers -32602 with it); a caller
    without the service token is refused by the service itself."""
    async with InternalClient({"ingest": [stack.ingest_url]}, stack.service_token, 30) as client:
        with pytest.raises(InvalidParams):
            await client.call("ingest", "remember", {"topic": "t", "type": "fact"}, Principal.master(), None)
    async with InternalClient({"ingest": [stack.ingest_url]}, "not-the-token", 30) as client:
        with pytest.raises(UpstreamError) as refused:
            await client.call("ingest", "remember", {"content": "x", "topic": "t", "type": "fact"}, Principal.master(), None)
        assert refused.value.code == -32600


async def test_the_correlation_id_reaches_the_service(stack: Stack) -> None:
    """The call's correlation id rides in its headers: the service logs its tool line under it."""
    cid = unique("cid")
    token = correlation_id.set(cid)
    try:
        async with InternalClient({"recall": stack.recall_urls}, stack.service_token, 30) as client:
            await client.call("recall", "memory_stats", {}, Principal.master(), None)
    finally:
        correlation_id.reset(token)
    logs = [stack.log_dir / f"recall-{n}.log" for n in range(len(stack.recall_urls))]
    for _ in range(50):  # the log line is written as the reply goes out
        if any(f"cid={cid}" in path.read_text() and "tool memory_stats ok" in path.read_text() for path in logs):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no recall log line under cid={cid}")


async def test_a_replica_that_takes_the_call_and_never_answers_is_unavailable(stack: Stack) -> None:
    """Past the read timeout the call fails as Unavailable, without going on to the next
    replica: the hung one may have done the write, and a second try elsewhere would do it twice."""
    taken: list[bytes] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        taken.append(await reader.read(65536))
        await asyncio.sleep(30)
        writer.close()

    hung = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    try:
        replicas = {"ingest": [f"http://127.0.0.1:{port}", stack.ingest_url]}
        async with InternalClient(replicas, stack.service_token, 1.0) as client:
            with pytest.raises(Unavailable, match="ingest service unavailable"):
                await client.call("ingest", "remember", {"content": unique("x"), "topic": "t", "type": "fact"}, Principal.master(), None)
            # Had it gone on to the live replica after the timeout, the call would have succeeded.
            assert taken and b"POST /v1/tools/remember" in taken[0]
    finally:
        hung.close()


async def _one_reply_server(reply: bytes, taken: list[bytes]) -> asyncio.Server:
    """A replica that records the request it gets and answers `reply` (a whole HTTP response)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        taken.append(await reader.read(65536))
        writer.write(reply)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_a_call_says_how_long_its_caller_waits_and_a_503_comes_back_unavailable() -> None:
    """The client's read timeout rides in TIMEOUT_HEADER, so a service can shed work its caller
    will not wait for; the service's 503 (a search shed, a dependency it lacks) is Unavailable,
    which every surface answers 503 with Retry-After, not an internal error."""
    body = json.dumps({"error": {"code": -32603, "message": "recall service busy: no search slot"}}).encode()
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    reply = head + b"content-length: %d\r\n\r\n%s" % (len(body), body)
    taken: list[bytes] = []
    server = await _one_reply_server(reply, taken)
    port = server.sockets[0].getsockname()[1]
    try:
        async with InternalClient({"recall": [f"http://127.0.0.1:{port}"]}, "token", 2.5) as client:
            with pytest.raises(Unavailable, match="recall service busy: no search slot"):
                await client.call("recall", "recall", {"text": "x"}, Principal.master(), None)
    finally:
        server.close()
    headers = taken[0].split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    assert f"{TIMEOUT_HEADER}: 2500".encode() in headers


async def test_the_callers_timeout_is_the_handlers_deadline() -> None:
    """The server side: TIMEOUT_HEADER's milliseconds from arrival are ToolContext.deadline on
    the event loop's clock; a missing or malformed header is no deadline."""
    seen: list[float | None] = []

    async def probe(_request: Request, ctx: ToolContext, _arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        seen.append(None if ctx.deadline is None else ctx.deadline - asyncio.get_running_loop().time())
        return {}, False

    app = FastAPI()
    install_internal_api(app, "probe", {"probe": probe}, lambda: "token")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        async with InternalClient({"probe": [f"http://127.0.0.1:{port}"]}, "token", 30) as client:
            await client.call("probe", "probe", {}, Principal.master(), None)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for value in (None, "", "soon", "-5", "0", "1.5"):
                headers = {SERVICE_TOKEN_HEADER: "token"} | ({TIMEOUT_HEADER: value} if value is not None else {})
                reply = await http.post("/v1/tools/probe", json={"principal": Principal.master().to_wire()}, headers=headers)
                assert reply.status_code == 200, reply.text
    finally:
        server.should_exit = True
        await task
    remaining = seen[0]
    assert remaining is not None and 25 < remaining <= 30
    assert seen[1:] == [None] * 6
