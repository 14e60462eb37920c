"""A tool's wire description: who answers it, what permission it needs, its tools/list meta."""

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

    def input_schema(self) -> dict[str, Any]:
        schema = self.args.model_json_schema(by_alias=True)
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.update(self.schema_overrides)
        return schema
