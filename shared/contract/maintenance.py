"""Tools that run or report maintenance work (consolidation, the async batch queue)."""

from __future__ import annotations

from pydantic import Field

from shared.contract.base import Label, ToolArgs
from shared.contract.spec import ToolSpec

# The stage names of the consolidation cycle (services/maintenance/pipeline.py STAGES);
# repeated here because the contract must not import the worker.
CONSOLIDATION_STAGES = (
    "embedding_backfill", "passage_backfill", "ttl_tiers", "importance_decay", "activation_decay", "expiry_gc", "exact_dedup",
    "semantic_dedup", "contradictions", "supersession", "co_retrieval", "session_cleanup", "anomalies",
)


class MemoryConsolidateArgs(ToolArgs):
    # seed: deprecated, kept in the schema for compatibility; no effect.
    stream: bool | None = Field(None, description="Deprecated, no effect (kept for compatibility).")
    stages: list[Label] | None = Field(
        None, max_length=len(CONSOLIDATION_STAGES),
        description=f"Run only these stages (default: all enabled). One of: {', '.join(CONSOLIDATION_STAGES)}.",
    )
    wait: bool = Field(True, description="Wait (bounded) for the cycle and return its report; false returns {queued, runId}.")


MAINTENANCE_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "memory_consolidate",
        "Run the maintenance cycle now: TTL tier transitions, importance decay, expiry, duplicate merge "
        "(with the safety gate), contradiction links, supersession, embedding and passage backfill, co-retrieval links, "
        "session cleanup, anomaly scan. Returns what each stage did, or {queued, runId} if it is still "
        "running. The scheduler runs the same cycle every 6 hours.",
        MemoryConsolidateArgs, "ingest", ("consolidate", "maintenance"), "admin", True, requires_master=False,
    ),
)
