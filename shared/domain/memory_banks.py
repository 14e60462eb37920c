"""Memory banks (reference 001's namespaces and entries) as wire objects, with the limits and
rules the reference names. Shared by recall (reads) and ingest (writes); no web framework."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

# seed 001 "제한": checked where the REST API accepts a write, not by the store (an import
# takes whatever an export wrote).
NAME_MAX_BYTES = 200
DESCRIPTION_MAX_BYTES = 2000
CONTENT_MAX_BYTES = 102_400
TAGS_MAX = 50
TAG_MAX_BYTES = 100
QUERY_MAX_BYTES = 500
EXTRACT_MESSAGES_MAX = 100
EXTRACT_MESSAGE_MAX_BYTES = 50_000
PAGE_LIMIT_DEFAULT = 100
PAGE_LIMIT_MAX = 1000
BULK_IDS_MAX = 1000
CONTEXT_TOKENS_DEFAULT = 2000
CONTEXT_TOKENS_MAX = 100_000
IMPORT_BODY_LIMIT_BYTES = 50 * 1024 * 1024  # MEMORY_IMPORT_BODY_LIMIT_BYTES
# Lexical consolidation clusters pairwise (quadratic): the newest this-many auto entries.
CONSOLIDATE_WINDOW = 500
SIMILARITY_DEFAULT = 0.8  # the extraction owner's fixed threshold, used as the default here
MAX_AGE_DAYS_DEFAULT = 60
SEARCH_LIMIT_DEFAULT = 20
EXPORT_VERSION = 1

# The reserved marks of a Layer-A agent-experience bank: a description starting with the
# marker (the reference names no literal; this one is Engram's), or for consolidation also
# a name starting with "Agent Experience:" (the reference's literal).
AGENT_EXPERIENCE_MARKER = "[agent-experience]"
AGENT_EXPERIENCE_NAME_PREFIX = "Agent Experience:"

SOURCES = ("auto", "manual")
# The streamed import and export (raw internal routes, not tool calls) carry the caller's
# Principal in this header beside the service token.
PRINCIPAL_HEADER = "x-engram-principal"
_WORDS = re.compile(r"\w+", re.UNICODE)


def is_agent_experience(description: str | None) -> bool:
    return (description or "").startswith(AGENT_EXPERIENCE_MARKER)


def consolidation_protected(name: str, description: str | None) -> bool:
    return is_agent_experience(description) or name.startswith(AGENT_EXPERIENCE_NAME_PREFIX)


def iso(value: datetime | None) -> str | None:
    """A UTC timestamp as RFC 3339 with Z, as the reference's chrono serializer writes it."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(value: Any) -> datetime | None:
    """An export's timestamp back to a datetime (None when absent or not one)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def source_of(column: str | None) -> str:
    """The fragment's source column as MemorySource: 'manual' is manual; anything else (an
    entry written as auto, a fragment an agent remembered over MCP) is auto."""
    return "manual" if column == "manual" else "auto"


def namespace_wire(row: Any) -> dict[str, Any]:
    return {
        "id": str(row["id"]), "name": row["name"], "description": row["description"], "enabled": row["enabled"],
        "createdAt": iso(row["created_at"]), "updatedAt": iso(row["updated_at"]),
    }


def entry_wire(row: Any, metadata: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"], "namespaceId": str(row["namespace_id"]), "content": row["content"],
        "source": source_of(row["source"]), "tags": list(row["keywords"] or []), "metadata": metadata,
        "createdAt": iso(row["created_at"]), "updatedAt": iso(row["updated_at"]),
    }


def byte_length(text: str) -> int:
    return len(text.encode("utf-8"))


def estimate_tokens(characters: int) -> int:
    """The stats' token estimate: ~4 characters a token (the context counts exactly)."""
    return -(-characters // 4)


def word_set(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORDS.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Lexical similarity of two entries: shared words over all words."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


class MemoryApiError(Exception):
    """A refusal the memory REST API answers with this HTTP status (400, 404, 413, 422, 503)
    and message. Raised by recall and ingest, carried back over the internal RPC as a tool
    error, turned into the HTTP reply by the gateway (services/gateway/memory_api/)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def to_result(self) -> dict[str, Any]:
        return {"httpStatus": self.status, "message": self.message}


def not_found(what: str) -> MemoryApiError:
    return MemoryApiError(404, f"{what} not found")
