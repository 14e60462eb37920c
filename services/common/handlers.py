"""A service's table of internal tool handlers, joined from the surfaces' own tables.

Each surface (MCP, the admin views, the REST APIs of the other references) names its handlers;
two surfaces naming one handler alike would silently serve the later one for both, so a clash
stops the service at import instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def joined(*tables: Mapping[str, Any]) -> dict[str, Any]:
    """The union of `tables`; a name that appears in two of them raises ValueError."""
    table: dict[str, Any] = {}
    for part in tables:
        clash = table.keys() & part.keys()
        if clash:
            raise ValueError(f"internal tool names defined twice: {sorted(clash)}")
        table.update(part)
    return table
