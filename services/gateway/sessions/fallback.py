"""Redis with this process to fall back on while Redis does not answer."""

from __future__ import annotations

import contextlib

from services.gateway.core.round_trip import RoundTrip
from services.gateway.sessions.store import (
    UNREACHABLE,
    CallTimes,
    Change,
    Document,
    Gate,
    Loaded,
    Loading,
    MemorySessionStore,
    PlannedCall,
    Recorded,
    RedisSessionStore,
)


class FallbackSessionStore:
    """Redis, and this process while Redis does not answer: a replica keeps serving the
    sessions it opens during an outage (as one replica would), and every session Redis holds
    comes back with Redis. A session opened during the outage stays with its replica."""

    def __init__(self, primary: RedisSessionStore, local: MemorySessionStore) -> None:
        self.primary = primary
        self.local = local

    async def get(self, key: str) -> Document | None:
        try:
            found = await self.primary.get(key)
        except UNREACHABLE:
            found = None
        return found if found is not None else await self.local.get(key)

    async def get_many(self, keys: list[str]) -> list[Document | None]:
        try:
            found = await self.primary.get_many(keys)
        except UNREACHABLE:
            found = [None] * len(keys)
        return [doc if doc is not None else await self.local.get(key) for key, doc in zip(keys, found, strict=True)]

    async def put(self, key: str, value: Document, ttl: float) -> None:
        if await self.local.get(key) is None:
            try:
                await self.primary.put(key, value, ttl)
                return
            except UNREACHABLE:
                pass
        await self.local.put(key, value, ttl)

    async def put_new(self, key: str, value: Document, ttl: float) -> bool:
        try:
            return await self.primary.put_new(key, value, ttl)
        except UNREACHABLE:
            return await self.local.put_new(key, value, ttl)

    async def delete(self, *keys: str) -> None:
        await self.local.delete(*keys)
        with contextlib.suppress(*UNREACHABLE):
            await self.primary.delete(*keys)

    async def update(self, key: str, change: Change, ttl: float) -> tuple[Document | None, Document | None]:
        if await self.local.get(key) is not None:
            return await self.local.update(key, change, ttl)
        try:
            return await self.primary.update(key, change, ttl)
        except UNREACHABLE:
            return None, None

    async def load(self, id_key: str, doc_prefix: str, ttl: float, *, touch: bool) -> tuple[Document, Document] | None:
        try:
            found = await self.primary.load(id_key, doc_prefix, ttl, touch=touch)
        except UNREACHABLE:
            found = None
        return found if found is not None else await self.local.load(id_key, doc_prefix, ttl, touch=touch)

    def queue_load(self, trip: RoundTrip, loading: Loading) -> Loading:
        return self.primary.queue_load(trip, loading)

    async def loaded(self, loading: Loading) -> Loaded | None:
        try:
            found = await self.primary.loaded(loading)
        except UNREACHABLE:
            found = None
        return found if found is not None else await self.local.loaded(loading)

    async def record(
        self, key: str, log_key: str, entry: Document, keep: int, ttl: float, call: CallTimes, gate: Gate | None = None
    ) -> Recorded:
        if await self.local.get(key) is not None:
            return await self.local.record(key, log_key, entry, keep, ttl, call, gate)
        try:
            return await self.primary.record(key, log_key, entry, keep, ttl, call, gate)
        except UNREACHABLE:
            return Recorded("gone")

    async def unrecord(self, planned: PlannedCall, handle: str, recorded: Recorded) -> None:
        with contextlib.suppress(*UNREACHABLE):
            await self.primary.unrecord(planned, handle, recorded)

    async def swap(
        self, key: str, version: int, value: Document, ttl: float, log_key: str, entry: Document, keep: int
    ) -> tuple[bool, Document | None]:
        if await self.local.get(key) is not None:
            return await self.local.swap(key, version, value, ttl, log_key, entry, keep)
        try:
            return await self.primary.swap(key, version, value, ttl, log_key, entry, keep)
        except UNREACHABLE:
            return False, None

    async def log(self, log_key: str) -> list[Document]:
        found = await self.local.log(log_key)
        if found:
            return found
        try:
            return await self.primary.log(log_key)
        except UNREACHABLE:
            return []

    async def touch(self, handle: str, keys: list[str], ttl: float) -> None:
        if await self.local.last_used(handle) is not None:  # a session opened during an outage
            await self.local.touch(handle, keys, ttl)
            return
        try:
            await self.primary.touch(handle, keys, ttl)
        except UNREACHABLE:
            await self.local.touch(handle, keys, ttl)

    async def last_used(self, handle: str) -> float | None:
        try:
            used = await self.primary.last_used(handle)
        except UNREACHABLE:
            used = None
        return used if used is not None else await self.local.last_used(handle)

    async def unused_since(self, before: float) -> list[str]:
        try:
            handles = await self.primary.unused_since(before)
        except UNREACHABLE:
            handles = []
        return [*handles, *await self.local.unused_since(before)]

    async def forget_use(self, handle: str) -> None:
        await self.local.forget_use(handle)
        with contextlib.suppress(*UNREACHABLE):
            await self.primary.forget_use(handle)

    async def count_used(self) -> int:
        try:
            shared = await self.primary.count_used()
        except UNREACHABLE:
            shared = 0
        return shared + await self.local.count_used()

    async def aclose(self) -> None:
        return None
