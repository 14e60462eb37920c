"""Read-your-writes for the REST surface's writes: ingest serves them through the other
modules' handlers (services/ingest/api.py), which must record the writing key's WAL position
as remember does, or a read right after may be served by a replica that has not caught up."""

from __future__ import annotations

from redis.asyncio import Redis

from services.stack.supervisor import Stack
from shared.read_routing import WRITE_POSITION_KEY, owner_name
from tests.memory_api.conftest import Tenant


async def test_an_entry_written_records_its_key_s_write_position(stack: Stack, tenant: Tenant) -> None:
    ns = (await tenant.namespace())["id"]
    position = WRITE_POSITION_KEY.format(owner=owner_name(tenant.key_id))
    redis = Redis.from_url(stack.redis_url)
    try:
        assert await redis.get(position) is not None  # the namespace's own write
        await redis.delete(position)
        await tenant.entry(ns, "The staging cluster is rebuilt every Sunday night.")
        recorded = await redis.get(position)
        assert recorded is not None and int(recorded, 16) > 0
    finally:
        await redis.aclose()
