"""memory:* events (issue 19, item 6): GET /api/v1/memory/events (SSE) and /ws (WebSocket) on any
gateway replica, fed by every write path through one durable, bounded log.

Writes go through one gateway process and events are read on another (the stack's gateway
and a second one on the same database and Redis). A test that must show that nothing else
arrived writes a sentinel afterwards: the next event is the sentinel's, not an extra one."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis
import websockets
from websockets.exceptions import InvalidStatus

from services.gateway.memory_api.events import EventHub, Subscription
from services.stack.redis_server import LocalRedis
from services.stack.redis_switch import RedisSwitch
from services.stack.supervisor import ServiceProcess, Stack, free_port
from shared.db import SEARCH_PATH
from shared.domain.principal import Principal
from shared.memory_events import ENTRIES_CHANGED, NAMESPACES_CHANGED, STREAM_GAP, STREAM_LAGGED, EventLog, LogBounds, StreamId
from shared.repositories import memory_event_outbox as outbox_repo
from shared.repositories.memory_event_outbox import OutboxEvent
from shared.settings import CommonSettings
from tests.gateway.conftest import Gateway, start_gateway
from tests.ingest.helpers import ingest_call
from tests.support import call, create_api_key, mcp_session, new_stack_config, running, unique

ADMIN = "/v1/internal/model/nothing"
WAIT = 60.0  # generous: 2 cores shared by many test processes


@pytest.fixture(scope="module")
def replica(stack: Stack) -> Iterator[Gateway]:
    """A second gateway process on the stack's database and Redis (database 0, as ingest);
    keep-alives every second, so positions and key checks come quickly."""
    proc: ServiceProcess
    proc, gateway = start_gateway(stack, "gateway-events", 0, {"ENGRAM_MEMORY_EVENTS_KEEPALIVE": "1"})
    yield gateway
    proc.stop()


@dataclass
class Sse:
    """The frames of one SSE response: events (with their ids) and every id line seen."""

    response: httpx.Response
    lines: AsyncIterator[str]
    last_id: str | None = None
    comments: list[str] = field(default_factory=list)

    async def next_event(self) -> dict[str, Any]:
        """The next frame that has an event name: {"id", "event", "data"} (keep-alives
        between are read past, within one deadline)."""
        async with asyncio.timeout(WAIT):
            return await self._next_event()

    async def _next_event(self) -> dict[str, Any]:
        frame: dict[str, Any] = {}
        while True:
            line = await anext(self.lines)
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
            elif line.startswith("id:"):
                frame["id"] = self.last_id = line[3:].strip()
            elif line.startswith("event:"):
                frame["event"] = line[6:].strip()
            elif line.startswith("data:"):
                frame["data"] = json.loads(line[5:].strip())
            elif line == "" and "event" in frame:
                return frame
            elif line == "":
                frame = {}

    async def events(self, n: int) -> list[dict[str, Any]]:
        return [await self.next_event() for _ in range(n)]


@asynccontextmanager
async def subscribe(url: str, key: str, **params: str) -> AsyncIterator[Sse]:
    headers = {"X-API-Key": key}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = params.pop("last_event_id")
    async with httpx.AsyncClient(timeout=httpx.Timeout(WAIT, read=None)) as http, http.stream(
        "GET", f"{url}/api/v1/memory/events", params=params, headers=headers
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        sse = Sse(response, response.aiter_lines())
        # The first block says where the subscription starts: events after it are delivered.
        while not any(c.startswith("subscribed at") for c in sse.comments):
            line = await asyncio.wait_for(anext(sse.lines), WAIT)
            if line.startswith(":"):
                sse.comments.append(line[1:].strip())
        yield sse


async def namespace_of(stack: Stack, fragment_id: str) -> str:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        return str(await conn.fetchval("SELECT namespace_id FROM fragments WHERE id = $1", fragment_id))
    finally:
        await conn.close()


async def admin_import(stack: Stack, items: list[dict[str, Any]], key_id: str) -> None:
    """The admin API's import (a JSON array, every item into key_id's tenant)."""
    async with httpx.AsyncClient(timeout=WAIT) as http:
        reply = await http.post(f"{stack.gateway_url}{ADMIN}/import", params={"key_id": key_id}, json=items,
                                headers={"Authorization": f"Bearer {stack.master_key}"})
    assert reply.status_code == 200 and reply.json()["imported"] == len(items), reply.text


def fact(topic: str, text: str) -> dict[str, Any]:
    return {"content": f"{text} ({topic})", "topic": topic, "type": "fact"}


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["data"]["namespaceId"]) for e in events]


async def remember(url: str, key: str, topic: str, text: str) -> str:
    """The id of a new fact in bank `topic` (created by this write when new)."""
    async with mcp_session(url, key) as s:
        stored = await call(s, "remember", fact(topic, text))
    assert stored.get("success") and not stored.get("duplicate"), stored
    return str(stored["id"])


def created(ns: str) -> list[tuple[str, str]]:
    """A write into a new bank: the bank is made before its first entry is stored."""
    return [(NAMESPACES_CHANGED, ns), (ENTRIES_CHANGED, ns)]


async def test_written_on_one_replica_read_on_another_then_resumed_exactly(stack: Stack, replica: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    first_topic = unique("bank")
    async with subscribe(replica.url, key) as sse:
        fid = await remember(stack.mcp_url, key, first_topic, "The staging cluster rebuilds every night at two")
        ns = await namespace_of(stack, fid)
        got = await sse.events(2)
    # A remember in a new topic creates its bank, then its entry: both events, camelCase payload.
    assert kinds(got) == created(ns)
    last = got[-1]["id"]

    # Missed while disconnected: two new banks, a forget in the first one.
    topics = [unique("bank"), unique("bank")]
    missed_ns = []
    for n, topic in enumerate(topics):
        fid2 = await remember(stack.mcp_url, key, topic, f"Release train {n} leaves on Thursdays at noon")
        missed_ns.append(await namespace_of(stack, fid2))
    async with mcp_session(stack.mcp_url, key) as s:
        forgot = await call(s, "forget", {"id": fid})
    assert forgot["deleted"] == 1, forgot

    # Resumed on the other replica (the stack's gateway) with Last-Event-ID: exactly those.
    async with subscribe(stack.gateway_url, key, last_event_id=last) as sse:
        resumed = await sse.events(5)
        sentinel_topic = unique("bank")
        sid = await remember(stack.mcp_url, key, sentinel_topic, "The sentinel fact closes this resumption test")
        sentinel_ns = await namespace_of(stack, sid)
        after = await sse.events(2)
    assert kinds(resumed) == [*created(missed_ns[0]), *created(missed_ns[1]), (ENTRIES_CHANGED, ns)]
    assert all(StreamId.parse(e["id"]) > StreamId.parse(last) for e in resumed)
    assert kinds(after) == created(sentinel_ns)  # nothing else came between

    # ?since= resumes the same way (the header wins when both are given).
    async with subscribe(replica.url, key, since=resumed[3]["id"]) as sse:
        assert kinds(await sse.events(1)) == [(ENTRIES_CHANGED, ns)]


async def test_types_filter_and_its_refusals(stack: Stack, replica: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with subscribe(replica.url, key, types=ENTRIES_CHANGED) as sse:
        a = await remember(stack.mcp_url, key, unique("bank"), "Only entry events reach this subscriber")
        b = await remember(stack.mcp_url, key, unique("bank"), "A second bank, a second entry event")
        got = await sse.events(2)
    # No namespaces-changed in between although both remembers created a bank.
    assert kinds(got) == [(ENTRIES_CHANGED, await namespace_of(stack, a)), (ENTRIES_CHANGED, await namespace_of(stack, b))]
    async with httpx.AsyncClient(timeout=WAIT) as http:
        for bad in ("data:hub-changed", "memory:entry-changed", "", f"{ENTRIES_CHANGED},stream:gap"):
            reply = await http.get(f"{replica.url}/api/v1/memory/events", params={"types": bad}, headers={"X-API-Key": key})
            assert reply.status_code == 400, (bad, reply.text)
        reply = await http.get(f"{replica.url}/api/v1/memory/events", params={"since": "yesterday"}, headers={"X-API-Key": key})
        assert reply.status_code == 400


async def test_each_key_sees_only_its_tenant_and_the_master_sees_both(stack: Stack, replica: Gateway) -> None:
    one, _ = await create_api_key(stack.database_url)
    two, _ = await create_api_key(stack.database_url)
    reader, reader_id = await create_api_key(stack.database_url, permissions=["read"])
    writer_only, _ = await create_api_key(stack.database_url, permissions=["write"])
    events = f"{replica.url}/api/v1/memory/events"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        assert (await http.get(events)).status_code == 401
        assert (await http.get(events, headers={"X-API-Key": "mk_nope"})).status_code == 401
        assert (await http.get(events, headers={"X-API-Key": writer_only})).status_code == 403  # no memory_read
    async with (
        subscribe(replica.url, one) as sse_one,
        subscribe(stack.gateway_url, two) as sse_two,
        subscribe(replica.url, stack.master_key, types=NAMESPACES_CHANGED) as sse_master,
        subscribe(replica.url, reader) as sse_reader,
    ):
        a = await remember(stack.mcp_url, one, unique("bank"), "Tenant one keeps its deploy notes here")
        b = await remember(stack.mcp_url, two, unique("bank"), "Tenant two keeps its billing notes here")
        ns_a, ns_b = await namespace_of(stack, a), await namespace_of(stack, b)
        assert kinds(await sse_one.events(2)) == created(ns_a)
        assert kinds(await sse_two.events(2)) == created(ns_b)
        # The master key sees every tenant (other tests' banks too: look for both).
        seen: set[str] = set()
        while not {ns_a, ns_b} <= seen:
            seen.add((await sse_master.next_event())["data"]["namespaceId"])
        # The third tenant's first event is its own (written after the others'), not theirs.
        item = {"id": unique("own"), "content": "The read-only tenant's own imported note", "topic": unique("bank"), "type": "fact"}
        await admin_import(stack, [item], reader_id)
        assert kinds(await sse_reader.events(2)) == created(await namespace_of(stack, item["id"]))


async def test_forget_import_and_consolidation_publish(stack: Stack, replica: Gateway) -> None:
    key, key_id = await create_api_key(stack.database_url)
    topic = unique("bank")
    text = "Imported twice on purpose so that consolidation merges the copies"
    items = [{"id": unique("imp"), "content": text, "topic": topic, "type": "fact"} for _ in range(2)]
    async with subscribe(replica.url, key) as sse:
        await admin_import(stack, items, key_id)
        ns = await namespace_of(stack, items[0]["id"])
        imported = await sse.events(2)
        assert kinds(imported) == created(ns)  # one entries-changed for both entries

        async with mcp_session(stack.mcp_url, stack.master_key) as s:
            run = await call(s, "memory_consolidate", {"stages": ["exact_dedup"], "wait": True})
        assert run.get("status") == "succeeded", run
        assert kinds(await sse.events(1)) == [(ENTRIES_CHANGED, ns)]  # one copy merged away

        async with mcp_session(stack.mcp_url, key) as s:
            gone = await call(s, "forget", {"topic": topic, "force": True})
        assert gone["deleted"] >= 1, gone
        assert kinds(await sse.events(1)) == [(ENTRIES_CHANGED, ns)]


async def test_websocket_carries_the_same_events_and_resumes(stack: Stack, replica: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws_url = replica.url.replace("http://", "ws://") + "/api/v1/memory/ws"
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(ws_url):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(ws_url + "?types=memory:nothing", additional_headers={"X-API-Key": key}):
            pass
    assert refused.value.response.status_code == 400

    async with subscribe(replica.url, key) as sse:
        fid = await remember(stack.mcp_url, key, unique("bank"), "The websocket sees what the stream sees")
        first = await sse.events(2)
    ns = await namespace_of(stack, fid)
    async with websockets.connect(f"{ws_url}?since={first[0]['id']}&types={ENTRIES_CHANGED}",
                                  additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        message = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
        assert kinds(first) == created(ns)
        assert message == {"id": first[1]["id"], "event": ENTRIES_CHANGED, "data": {"namespaceId": ns}}
        later = await remember(stack.mcp_url, key, unique("bank"), "A live event after the resumed one")
        live = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
        assert live["event"] == ENTRIES_CHANGED and live["data"] == {"namespaceId": await namespace_of(stack, later)}


async def test_a_resumption_older_than_the_log_starts_with_a_gap(stack: Stack, replica: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with subscribe(replica.url, key) as sse:
        await remember(stack.mcp_url, key, unique("bank"), "This event will be trimmed out of the log")
        old = await sse.events(2)
        await remember(stack.mcp_url, key, unique("bank"), "This event stays in the log after the trim")
        kept = await sse.events(2)
    client = aioredis.Redis.from_url(stack.redis_url)
    try:  # what MAXLEN / MINID do to old entries, done now
        await client.xtrim(CommonSettings().memory_events_stream, minid=kept[0]["id"], approximate=False)
    finally:
        await client.aclose()
    async with subscribe(stack.gateway_url, key, last_event_id=old[0]["id"]) as sse:
        gap = await sse.next_event()
        assert gap["event"] == STREAM_GAP and gap["data"]["lastEventId"] == old[0]["id"]
        assert gap["data"]["oldestEventId"] is not None
        assert [e["id"] for e in await sse.events(2)] == [e["id"] for e in kept]
        assert sse.last_id == kept[-1]["id"]
    # A position the log still holds resumes without one.
    async with subscribe(stack.gateway_url, key, last_event_id=kept[0]["id"]) as sse:
        assert (await sse.next_event())["id"] == kept[1]["id"]


async def test_a_subscriber_the_log_outran_is_told_it_lagged(stack: Stack) -> None:
    """Against the real Redis, on a stream of the test's own: a subscriber's position falls out
    of the log while it is live (the log trimmed under it) -> stream:lagged, then what is kept."""
    settings = CommonSettings(ENGRAM_MEMORY_EVENTS_STREAM=unique("events-lag"), REDIS_URL=stack.redis_url)
    client = aioredis.Redis.from_url(stack.redis_url)
    log = EventLog(client, settings)
    try:
        await log.append([OutboxEvent(n, ENTRIES_CHANGED, "k1", {"namespaceId": f"ns-{n}"}) for n in range(5)])
        ids = [e.id for e in await log.after(StreamId(0, 0), 10)]
        reader = Principal(key_id="k1", visible_key_ids=("k1",))
        sub, gap = await Subscription.open(EventHub(log), reader, frozenset([ENTRIES_CHANGED]), ids[0])
        assert gap is None
        await client.xtrim(settings.memory_events_stream, minid=str(ids[3]), approximate=False)
        frames = sub.frames(keepalive=5)
        lagged = await anext(frames)
        assert lagged.event == STREAM_LAGGED and lagged.data == {"lastEventId": str(ids[0]), "oldestEventId": str(ids[3])}
        assert [(await anext(frames)).data for _ in range(2)] == [{"namespaceId": "ns-3"}, {"namespaceId": "ns-4"}]
    finally:
        await client.delete(settings.memory_events_stream, f"{settings.memory_events_stream}:origin")
        await client.aclose()


def test_stream_ids_and_loss_detection() -> None:
    assert StreamId.parse("1700000000000-3") == StreamId(1700000000000, 3)
    assert StreamId.parse("1700000000000") == StreamId(1699999999999, 2**64 - 1)  # from that ms on
    assert StreamId(5, 0).before() == StreamId(4, 2**64 - 1) and StreamId(5, 2).before() == StreamId(5, 1)
    for bad in ("", "abc", "1-", "-1", "1-2-3", "1-x", "9" * 30):
        with pytest.raises(ValueError):
            StreamId.parse(bad)
    untouched = LogBounds(first=StreamId(10, 0), last=StreamId(20, 0), max_deleted=StreamId(0, 0))
    assert not untouched.lost_after(StreamId(0, 0)) and not untouched.lost_after(StreamId(15, 0))
    assert untouched.lost_after(StreamId(21, 0))  # not from this log
    trimmed = LogBounds(first=StreamId(10, 0), last=StreamId(20, 0), max_deleted=StreamId(9, 0))
    assert trimmed.lost_after(StreamId(8, 0)) and not trimmed.lost_after(StreamId(9, 0))
    # Redis 6.2 (no max-deleted-entry-id): once trimmed, older than the oldest kept is lost;
    # never trimmed (the oldest kept is the first ever appended), nothing is.
    old_redis = LogBounds(first=StreamId(10, 0), last=StreamId(20, 0), max_deleted=None, origin=StreamId(3, 0))
    assert old_redis.lost_after(StreamId(8, 0)) and not old_redis.lost_after(StreamId(9, 2**64 - 1))
    whole = LogBounds(first=StreamId(10, 0), last=StreamId(20, 0), max_deleted=None, origin=StreamId(10, 0))
    assert not whole.lost_after(StreamId(0, 0)) and whole.lost_after(StreamId(21, 0))


async def test_the_rest_api_and_its_import_publish_as_the_reference_says(stack: Stack, replica: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    api = f"{stack.gateway_url}/api/v1/memory"
    headers = {"X-API-Key": key}
    async with subscribe(replica.url, key) as sse, httpx.AsyncClient(timeout=WAIT, headers=headers) as http:
        made = await http.post(f"{api}/namespaces", json={"name": unique("Coding style"), "description": "Conventions"})
        assert made.status_code == 201, made.text
        ns = made.json()["id"]
        assert kinds(await sse.events(1)) == [(NAMESPACES_CHANGED, ns)]
        entry = await http.post(f"{api}/namespaces/{ns}/entries", json={"content": "Prefer pnpm over npm here.", "source": "manual"})
        assert entry.status_code == 201, entry.text
        assert kinds(await sse.events(1)) == [(ENTRIES_CHANGED, ns)]
        assert (await http.put(f"{api}/namespaces/{ns}", json={"description": "Conventions of this codebase"})).status_code == 200
        assert (await http.patch(f"{api}/namespaces/{ns}/toggle", json={"enabled": False})).status_code == 200
        assert kinds(await sse.events(2)) == [(NAMESPACES_CHANGED, ns)] * 2

        # A whole-store import that only merges into an existing bank: entries-changed for
        # that bank, no namespaces-changed (reference 001). The toggle after it is the next.
        document = (await http.get(f"{api}/export")).json()
        merged = await http.post(f"{api}/import", params={"onConflict": "merge"}, json={"data": json.dumps(document)})
        assert merged.status_code == 200 and merged.json()["entriesImported"] == 1, merged.text
        assert (await http.patch(f"{api}/namespaces/{ns}/toggle", json={"enabled": True})).status_code == 200
        assert kinds(await sse.events(2)) == [(ENTRIES_CHANGED, ns), (NAMESPACES_CHANGED, ns)]

        # Deleting the bank deletes its entries with it: one namespaces-changed says both.
        assert (await http.delete(f"{api}/namespaces/{ns}")).status_code == 204
        other = await http.post(f"{api}/namespaces", json={"name": unique("After"), "description": ""})
        assert kinds(await sse.events(2)) == [(NAMESPACES_CHANGED, ns), (NAMESPACES_CHANGED, other.json()["id"])]


@pytest.fixture(scope="module")
def redis_switch(stack_dir: Path) -> Iterator[RedisSwitch]:
    redis = LocalRedis(stack_dir / "events-switched-redis", free_port())
    redis.start()
    switch = RedisSwitch(redis.port)
    switch.start()
    yield switch
    switch.stop()
    redis.stop()


@pytest.fixture(scope="module")
async def switched(stack: Stack, stack_dir: Path, redis_switch: RedisSwitch) -> AsyncIterator[Stack]:
    """A stack of its own (its own Postgres: the session stack's relays would publish a
    shared outbox) whose Redis a switch can hang; beat off, the ingest relay alone publishes."""
    async with running(new_stack_config(stack_dir / "events-redis-faults", redis_url=redis_switch.url, beat=False)) as own:
        yield own


async def test_a_redis_outage_neither_fails_a_write_nor_loses_its_events(switched: Stack, redis_switch: RedisSwitch) -> None:
    key, key_id = await create_api_key(switched.database_url)
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,)).to_wire()

    async def write(topic: str) -> str:
        started = time.monotonic()
        reply = await ingest_call(switched, principal, "remember", fact(topic, f"Written while Redis is {redis_switch.mode}"))
        print(f"remember with Redis {redis_switch.mode}: {(time.monotonic() - started) * 1000:.0f} ms")  # noqa: T201 - printed, never asserted
        assert reply["result"]["success"] is True, reply
        return str(reply["result"]["id"])

    async with subscribe(switched.gateway_url, key) as sse:
        first = await write(unique("bank"))
        assert kinds(await sse.events(2)) == created(await namespace_of(switched, first))
        redis_switch.set("hung")
        try:
            during = [await write(unique("bank")) for _ in range(2)]
            conn = await asyncpg.connect(switched.database_url, server_settings={"search_path": SEARCH_PATH})
            try:  # the events wait in Postgres, not in a process
                waiting = await conn.fetchval("SELECT count(*) FROM memory_event_outbox WHERE key_id = $1", key_id)
            finally:
                await conn.close()
            assert waiting == 4
        finally:
            redis_switch.set("up")
        # The relay and the hub come back by themselves; the open stream delivers the rest.
        async with asyncio.timeout(120):
            late = [await sse._next_event() for _ in range(4)]  # a longer deadline than WAIT
    assert kinds(late) == [*created(await namespace_of(switched, during[0])), *created(await namespace_of(switched, during[1]))]


async def test_a_second_relay_waits_for_the_first_so_the_stream_keeps_the_outbox_order(stack: Stack) -> None:
    """Every ingest replica runs a relay. One holding a sink's oldest rows must not be overtaken
    by another claiming the next ones (SKIP LOCKED alone would hand it row 2 at once, and its
    XADD could land first: a bank's entries-changed before its namespaces-changed)."""
    sink = unique("sink")  # no relay of the stack drains it
    first, second = [
        await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH}) for _ in range(2)
    ]
    try:
        bank = {"namespaceId": "1"}
        await outbox_repo.insert(first, sink, [(NAMESPACES_CHANGED, None, bank), (ENTRIES_CHANGED, None, bank)])
        holding = first.transaction()
        await holding.start()
        claimed = await outbox_repo.claim(first, sink, 1)
        assert [e.type for e in claimed] == [NAMESPACES_CHANGED]

        async def other_relay() -> list[OutboxEvent]:
            async with second.transaction():
                return await outbox_repo.claim(second, sink, 10)

        claiming = asyncio.create_task(other_relay())
        async with asyncio.timeout(WAIT):  # until the second claim waits on a lock, or returns
            while not claiming.done() and not await first.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", second.get_server_pid()
            ):
                await asyncio.sleep(0.05)
        assert not claiming.done(), f"claimed {claiming.result()} while another relay held the sink's first row"
        await outbox_repo.delete(first, [e.id for e in claimed])
        await holding.commit()  # published: now the second relay gets the next row
        async with asyncio.timeout(WAIT):
            assert [e.type for e in await claiming] == [ENTRIES_CHANGED]
    finally:
        if first.is_in_transaction():
            await holding.rollback()
        await first.execute("DELETE FROM memory_event_outbox WHERE sink = $1", sink)
        await first.close()
        await second.close()
