"""Tools that run or report maintenance work (consolidation, the async batch queue)."""

from __future__ import annotations

from shared.contract.spec import ToolSpec

MAINTENANCE_TOOLS: tuple[ToolSpec, ...] = ()
