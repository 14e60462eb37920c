"""MCP session identity: the one owner of which logical session an Mcp-Session-Id names."""

from services.gateway.sessions.fallback import FallbackSessionStore
from services.gateway.sessions.model import ActiveSession, SessionGone, Transport, token_digest
from services.gateway.sessions.service import CallAhead, Sessions
from services.gateway.sessions.store import Gate, MemorySessionStore, RedisSessionStore, SessionStore

__all__ = [
    "ActiveSession",
    "CallAhead",
    "FallbackSessionStore",
    "Gate",
    "MemorySessionStore",
    "RedisSessionStore",
    "SessionGone",
    "SessionStore",
    "Sessions",
    "Transport",
    "token_digest",
]
