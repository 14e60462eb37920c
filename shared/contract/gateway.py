"""Tools the gateway answers itself (sessions, the skill guide)."""

from __future__ import annotations

from shared.contract.spec import ToolSpec

GATEWAY_TOOLS: tuple[ToolSpec, ...] = ()
