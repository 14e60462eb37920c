"""The one internal RPC client (services/common/rpc.py) against the real recall and ingest:
what the gateway and the maintenance worker rely on when they call them."""

from __future__ import annotations

import asyncio

import pytest

from services.common.rpc import InternalClient, UpstreamError
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
