"""Admin tool handlers served by ingest on behalf of maintenance (memory_consolidate)."""

from __future__ import annotations

from typing import Any

TOOL_HANDLERS: dict[str, Any] = {}
