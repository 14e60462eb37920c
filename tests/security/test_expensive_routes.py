"""The expensive routes are bounded per key: a memory import (up to 50 MiB, minutes of
embedding) runs one at a time per key on every replica; a second while the first runs is a
429, another key's import is not held up, and the key may import again once it finished."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from services.gateway.memory_api.transfer import import_lock_name
from services.stack.supervisor import Stack
from tests.security.conftest import MEMORY, http
from tests.support import create_api_key, unique


def document(entries: int) -> dict[str, str]:
    namespace = {"namespace": {"name": unique("bulk"), "description": ""}, "entries": [
        {"content": f"Imported fact {i}: the shard of tenant {i % 89} lives on node {i % 7}", "source": "manual"}
        for i in range(entries)]}
    return {"data": json.dumps({"version": 1, "namespaces": [namespace]})}


async def test_one_import_per_key_at_a_time(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    redis = aioredis.from_url(stack.redis_url)
    try:
        async with http(stack, {"X-API-Key": key}) as client, http(stack, {"X-API-Key": other}) as other_client:
            first = asyncio.create_task(client.post(f"{MEMORY}/import", json=document(3000)))
            async with asyncio.timeout(120):
                while not await redis.exists(import_lock_name(key_id)):
                    assert not first.done(), first.result().text  # the import must still be running
                    await asyncio.sleep(0.05)
            second = await client.post(f"{MEMORY}/import", json=document(1))
            beside = await other_client.post(f"{MEMORY}/import", json=document(1))
            done = await first
            again = await client.post(f"{MEMORY}/import", json=document(1))
    finally:
        await redis.aclose()
    assert second.status_code == 429, second.text
    assert beside.status_code == 200, beside.text
    assert done.status_code == 200 and done.json()["entriesImported"] == 3000, done.text
    assert again.status_code == 200, again.text
