"""A tool's wire description: who answers it, what permission it needs, its tools/list meta
and MCP annotations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

Permission = Literal["read", "write", "admin"]

# seed RBAC: a tool in this map needs that level; a tool missing from it needs none.
TOOL_PERMISSIONS: dict[str, Permission] = {
    "recall": "read",
    "context": "read",
    "memory_stats": "read",
    "graph_explore": "read",
    "fragment_history": "read",
    "reconstruct_history": "read",
    "search_traces": "read",
    "batch_status": "read",
    "remember": "write",
    "batch_remember": "write",
    "forget": "write",
    "amend": "write",
    "link": "write",
    "reflect": "write",
    "tool_feedback": "read",
    "session_rotate": "write",
    "memory_consolidate": "admin",
    "apply_update": "admin",
    "check_update": "admin",
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[BaseModel]
    service: Literal["recall", "ingest", "gateway"]
    capabilities: tuple[str, ...]
    risk_level: Literal["read", "write", "admin"]
    idempotent: bool
    requires_master: bool = False
    beta: bool = False
    schema_overrides: dict[str, Any] = field(default_factory=dict)
    # Deletes or overwrites what is stored (as opposed to adding to it): MCP's destructiveHint.
    destructive: bool = False

    @property
    def permission(self) -> Permission | None:
        return TOOL_PERMISSIONS.get(self.name)

    def meta(self) -> dict[str, Any]:
        return {
            "capabilities": list(self.capabilities),
            "riskLevel": self.risk_level,
            "requiresMaster": self.requires_master,
            "beta": self.beta,
            "idempotent": self.idempotent,
        }

    def annotations(self) -> dict[str, Any]:
        """The standard MCP tool annotations clients use for auto-approval, derived from the
        reference's meta: a read-risk tool is read-only unless it records something (not
        idempotent: tool_feedback); an admin tool counts as destructive; nothing reaches
        outside Engram's own store, so no tool is open-world."""
        read_only = self.risk_level == "read" and self.idempotent
        return {
            "readOnlyHint": read_only,
            "destructiveHint": not read_only and (self.destructive or self.risk_level == "admin"),
            "idempotentHint": self.idempotent,
            "openWorldHint": False,
        }

    def input_schema(self) -> dict[str, Any]:
        schema = self.args.model_json_schema(by_alias=True)
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.update(self.schema_overrides)
        return schema
