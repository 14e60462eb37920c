"""Every MCP tool Engram serves, assembled from each area's contract module."""

from __future__ import annotations

from shared.contract.gateway import GATEWAY_TOOLS
from shared.contract.maintenance import MAINTENANCE_TOOLS
from shared.contract.read import READ_TOOLS
from shared.contract.spec import TOOL_PERMISSIONS, ToolSpec
from shared.contract.write import WRITE_TOOLS

TOOLS: tuple[ToolSpec, ...] = (*WRITE_TOOLS, *READ_TOOLS, *GATEWAY_TOOLS, *MAINTENANCE_TOOLS)
TOOLS_BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}

__all__ = ["TOOLS", "TOOLS_BY_NAME", "TOOL_PERMISSIONS", "ToolSpec"]
