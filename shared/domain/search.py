"""What a recall asks for, independent of transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# seed depth enum: which types each depth covers.
DEPTH_TYPES: dict[str, tuple[str, ...] | None] = {
    "high-level": ("decision", "episode"),
    "detail": None,
    "tool-level": ("procedure", "error", "fact"),
}


@dataclass
class FragmentFilter:
    workspace: str | None = None
    topic: str | None = None
    types: tuple[str, ...] | None = None
    include_superseded: bool = False
    agent_id: str | None = None
    min_importance: float | None = None
    is_anchor: bool | None = None
    affects: tuple[str, ...] | None = None
    case_id: str | None = None
    resolution_status: str | None = None
    phase: str | None = None
    time_from: datetime | None = None
    time_to: datetime | None = None
    as_of: datetime | None = None
    exclude_ids: tuple[str, ...] = ()
    session_id: str | None = None
    # The caller's own session: session-scoped (working memory) fragments are visible only to it.
    caller_session: str | None = None

    def narrows_beyond_postings(self) -> bool:
        """Filters the lexical postings don't carry (they carry tenant, workspace and type)."""
        return any(v is not None for v in (
            self.topic, self.agent_id, self.min_importance, self.is_anchor, self.affects, self.case_id,
            self.resolution_status, self.phase, self.time_from, self.time_to, self.as_of, self.session_id,
        )) or bool(self.exclude_ids)


@dataclass
class RankedHit:
    id: str
    score: float
    layers: set[str] = field(default_factory=set)
