"""Every MCP tool Engram serves: who answers it, what permission it needs, its tools/list meta."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from shared.contract.read import MemoryStatsArgs, RecallArgs
from shared.contract.write import BatchRememberArgs, ForgetArgs, RememberArgs

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
    "tool_feedback": "write",
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


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Store one atomic memory fragment (1-3 sentences, one fact/decision/error/preference/"
        "procedure/relation/episode). Content over 4000 characters is refused; non-episode content "
        "is cut at 300 characters.",
        RememberArgs, "ingest", ("store", "dedup", "supersede", "link", "dryRun", "idempotency"), "write", False,
    ),
    ToolSpec(
        "batch_remember",
        "Store up to 200 fragments in one transaction; results[i] answers fragments[i].",
        BatchRememberArgs, "ingest", ("store", "batch", "async"), "write", False,
    ),
    ToolSpec(
        "recall",
        "Search memory: keyword and full-text (L2) fused with semantic vector search (L3), "
        "best first, packed into tokenBudget.",
        RecallArgs, "recall", ("search", "pagination", "caseMode"), "read", True,
    ),
    ToolSpec(
        "forget",
        "Delete a fragment by id, or all fragments of a topic. Permanent-tier fragments need force.",
        ForgetArgs, "ingest", ("delete", "dryRun"), "write", False,
    ),
    ToolSpec(
        "memory_stats",
        "Statistics of the caller's memory: counts, TTL distribution, types.",
        MemoryStatsArgs, "recall", ("stats",), "read", True,
    ),
)

TOOLS_BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}
