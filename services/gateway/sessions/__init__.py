"""MCP session identity: the one owner of which logical session an Mcp-Session-Id names."""

from services.gateway.sessions.service import (
    ActiveSession,
    SessionGone,
    Sessions,
    Transport,
    token_digest,
)
from services.gateway.sessions.store import FallbackSessionStore, MemorySessionStore, RedisSessionStore, SessionStore

__all__ = [
    "ActiveSession",
    "FallbackSessionStore",
    "MemorySessionStore",
    "RedisSessionStore",
    "SessionGone",
    "SessionStore",
    "Sessions",
    "Transport",
    "token_digest",
]
