"""Open memory:* subscriptions (SSE /api/v1/memory/events, WebSocket /api/v1/memory/ws) follow
their key as an MCP session does: a key set inactive or deleted gets no event from about a
second after the change on (RECHECK_SECONDS in services/gateway/memory_api/events.py), even on
a busy stream where no idle keep-alive ever comes, and a change of the key's groups changes
what it is sent. Also: the WebSocket takes no credential a browser would attach by itself."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from services.gateway.memory_api.events import RECHECK_SECONDS
from services.stack.supervisor import Stack
from shared.memory_events import ENTRIES_CHANGED, NAMESPACES_CHANGED
from tests.memory_api.test_events import subscribe
from tests.security.conftest import MEMORY, WAIT, admin, deactivate, delete_key, http
from tests.support import create_api_key, unique

PAST_RECHECK = RECHECK_SECONDS + 0.5


async def new_namespace(stack: Stack, key: str) -> str:
    async with http(stack, {"X-API-Key": key}) as client:
        made = await client.post(f"{MEMORY}/namespaces", json={"name": unique("bank"), "description": ""})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def master_entry(stack: Stack, ns: str) -> None:
    """An entry the master key writes into a key's bank: an event of that key's tenant, made
    without the key itself."""
    async with http(stack, {"X-API-Key": stack.master_key}) as client:
        made = await client.post(f"{MEMORY}/namespaces/{ns}/entries", json={"content": unique("note"), "source": "manual"})
    assert made.status_code == 201, made.text


@pytest.mark.parametrize("change", ["inactive", "deleted"])
async def test_an_open_sse_stream_ends_when_its_key_goes_even_while_events_flow(stack: Stack, change: str) -> None:
    key, key_id = await create_api_key(stack.database_url)
    ns = await new_namespace(stack, key)
    async with subscribe(stack.gateway_url, key, types=ENTRIES_CHANGED) as sse:
        await master_entry(stack, ns)
        assert (await sse.next_event())["data"] == {"namespaceId": ns}
        await (deactivate(stack, key_id) if change == "inactive" else delete_key(stack, key_id))
        await asyncio.sleep(PAST_RECHECK)
        if change == "inactive":  # a deleted key's bank went with it
            await master_entry(stack, ns)
        with pytest.raises(StopAsyncIteration):
            print("delivered after the key went:", await sse.next_event())


async def test_an_open_websocket_closes_when_its_key_is_set_inactive(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    ns = await new_namespace(stack, key)
    url = stack.gateway_url.replace("http://", "ws://") + f"{MEMORY}/ws?types={ENTRIES_CHANGED}"
    async with websockets.connect(url, additional_headers={"X-API-Key": key}, open_timeout=WAIT) as ws:
        await master_entry(stack, ns)
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["data"] == {"namespaceId": ns}
        await deactivate(stack, key_id)
        await asyncio.sleep(PAST_RECHECK)
        await master_entry(stack, ns)
        with pytest.raises(ConnectionClosed) as closed:
            print("delivered after the key went:", await asyncio.wait_for(ws.recv(), WAIT))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_subscription_follows_its_keys_groups(stack: Stack) -> None:
    one, one_id = await create_api_key(stack.database_url)
    two, two_id = await create_api_key(stack.database_url)
    async with subscribe(stack.gateway_url, one, types=NAMESPACES_CHANGED) as sse:
        group = (await admin(stack, "POST", "/groups", json={"name": unique("team")})).json()
        group_id = group.get("id") or group["group"]["id"]
        for member in (one_id, two_id):
            await admin(stack, "POST", f"/groups/{group_id}/members", json={"key_id": member})
        await asyncio.sleep(PAST_RECHECK)
        shared = await new_namespace(stack, two)
        assert (await sse.next_event())["data"]["namespaceId"] == shared  # a group member's bank
        async with http(stack, {"X-API-Key": one}) as client:  # reads follow the groups too
            assert (await client.get(f"{MEMORY}/namespaces/{shared}")).status_code == 200
        await admin(stack, "DELETE", f"/groups/{group_id}/members/{one_id}")
        async with http(stack, {"X-API-Key": one}) as client:
            assert (await client.get(f"{MEMORY}/namespaces/{shared}")).status_code == 404
        await asyncio.sleep(PAST_RECHECK)
        await new_namespace(stack, two)  # no longer one's to see
        own = await new_namespace(stack, one)
        assert (await sse.next_event())["data"]["namespaceId"] == own


async def test_the_websocket_takes_no_ambient_credential(stack: Stack) -> None:
    """A page on another origin can open a WebSocket with the user's cookies but cannot set
    its headers; the endpoint reads credentials from headers only, so such a page gets a 401
    whatever the Origin (a key a page holds itself is that page's own credential)."""
    key, _ = await create_api_key(stack.database_url)
    url = stack.gateway_url.replace("http://", "ws://") + f"{MEMORY}/ws"
    for headers in ({"Origin": "https://evil.example", "Cookie": f"api_key={key}"},
                    {"Origin": "https://evil.example", "Sec-WebSocket-Protocol": key}):
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(url, additional_headers=headers, open_timeout=WAIT):
                pass
        assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(f"{url}?access_token={key}", open_timeout=WAIT):
            pass
    assert refused.value.response.status_code == 401
