"""Mode presets (seed: X-Memento-Mode header, initialize params.mode, api_keys.default_mode):
each names the tools a session may list and call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

MODES = ("recall-only", "write-only", "onboarding", "audit")
MODE_HEADER = "x-memento-mode"

_READ = ("recall", "context", "memory_stats", "graph_explore", "fragment_history", "reconstruct_history", "search_traces")

# None = every tool. Lists as the seed's table has them.
ALLOWED_TOOLS: dict[str, frozenset[str] | None] = {
    "recall-only": frozenset((*_READ, "get_skill_guide", "tool_feedback")),
    "write-only": frozenset(("remember", "batch_remember", "forget", "amend", "link", "reflect")),
    "onboarding": None,
    "audit": frozenset(_READ),
}

T = TypeVar("T")


def normalize(mode: object) -> str | None:
    """A known preset name, or None (unknown values are ignored, as no preset)."""
    if isinstance(mode, str) and mode.strip().lower() in ALLOWED_TOOLS:
        return mode.strip().lower()
    return None


def allows(mode: str | None, tool: str) -> bool:
    allowed = ALLOWED_TOOLS.get(mode) if mode else None
    return allowed is None or tool in allowed


def visible(mode: str | None, tools: Sequence[T], name_of: Callable[[T], str]) -> list[T]:
    shown = [t for t in tools if allows(mode, name_of(t))]
    if mode == "onboarding":
        # seed: onboarding puts get_skill_guide first.
        shown.sort(key=lambda t: name_of(t) != "get_skill_guide")
    return shown
