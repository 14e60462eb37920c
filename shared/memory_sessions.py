"""Memory sessions of the mnemory REST surface (reference 004: MemorySession): which memories
a client already has, so /api/recall returns only new ones. In Redis (every gateway replica
and the worker see one store; a restart loses nothing), or in the process (SESSION_BACKEND=
memory, or no Redis: one gateway process only). A session expires after its idle TTL
(MEMORY_SESSION_TTL, 24 h by default); recall and remember prolong it. A session belongs to
the key that opened it: another key's id is an unknown session."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Protocol

import redis.asyncio as aioredis
from cachetools import TLRUCache

_PREFIX = "engram:mnemory:session:"
# Sessions one process keeps without Redis.
MEMORY_BACKEND_SIZE = 10_000


@dataclass
class MemorySession:
    session_id: str
    owner: str  # the key id, "" for the master key
    agent_id: str
    ttl: int  # idle seconds
    known: set[str] = field(default_factory=set)


def owner_of(key_id: str | None) -> str:
    return key_id or ""


def new_session_id() -> str:
    return f"ses_{secrets.token_hex(12)}"


class MemorySessionStore(Protocol):
    async def create(self, owner: str, agent_id: str | None, ttl: int) -> MemorySession: ...
    async def get(self, session_id: str, owner: str) -> MemorySession | None: ...
    async def add_known(self, session: MemorySession, ids: list[str]) -> None: ...


class RedisMemorySessions:
    """A hash (owner, agent, ttl) and a set of known ids per session, both expiring together."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def create(self, owner: str, agent_id: str | None, ttl: int) -> MemorySession:
        session = MemorySession(new_session_id(), owner, agent_id or "", ttl)
        key = _PREFIX + session.session_id
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={"owner": owner, "agent_id": session.agent_id, "ttl": str(ttl)})
        pipe.expire(key, ttl)
        await pipe.execute()
        return session

    async def get(self, session_id: str, owner: str) -> MemorySession | None:
        """The session (its idle timer reset), or None when unknown, expired or another key's."""
        key = _PREFIX + session_id
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.smembers(key + ":known")
        fields, known = await pipe.execute()
        if not fields:
            return None
        fields = {_text(k): _text(v) for k, v in fields.items()}
        if fields.get("owner", "") != owner:
            return None
        session = MemorySession(session_id, owner, fields.get("agent_id", ""), int(fields.get("ttl") or 0), {_text(i) for i in known})
        await self._prolong(session)
        return session

    async def add_known(self, session: MemorySession, ids: list[str]) -> None:
        if ids:
            await self.redis.sadd(_PREFIX + session.session_id + ":known", *ids)
            session.known.update(ids)
        await self._prolong(session)

    async def _prolong(self, session: MemorySession) -> None:
        key = _PREFIX + session.session_id
        pipe = self.redis.pipeline(transaction=False)
        pipe.expire(key, session.ttl)
        pipe.expire(key + ":known", session.ttl)
        await pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class InProcessMemorySessions:
    """SESSION_BACKEND=memory: each entry lives its own idle TTL from its last use."""

    def __init__(self) -> None:
        self._sessions: TLRUCache[str, MemorySession] = TLRUCache(
            MEMORY_BACKEND_SIZE, ttu=lambda _key, session, now: now + session.ttl, timer=time.monotonic
        )

    async def create(self, owner: str, agent_id: str | None, ttl: int) -> MemorySession:
        session = MemorySession(new_session_id(), owner, agent_id or "", ttl)
        self._sessions[session.session_id] = session
        return session

    async def get(self, session_id: str, owner: str) -> MemorySession | None:
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return None
        self._sessions[session_id] = session  # re-set: the idle timer starts again
        return session

    async def add_known(self, session: MemorySession, ids: list[str]) -> None:
        session.known.update(ids)
        self._sessions[session.session_id] = session
