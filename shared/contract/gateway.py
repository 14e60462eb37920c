"""Tools the gateway answers itself (sessions, the skill guide)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.contract.base import ToolArgs
from shared.contract.spec import ToolSpec

SKILL_SECTIONS = (
    "overview", "lifecycle", "keywords", "search", "episode", "multiplatform", "codex", "tools",
    "importance", "experiential", "cbr", "triggers", "antipatterns",
)


class GetSkillGuideArgs(ToolArgs):
    section: Literal[SKILL_SECTIONS] | None = Field(  # type: ignore[valid-type]
        None, description=f"Return only this section (default the whole guide): {', '.join(SKILL_SECTIONS)}.")


class SessionRotateArgs(ToolArgs):
    # seed: the tool's reason is at most 256 characters (the HTTP endpoint's is 128).
    reason: str | None = Field(
        None, max_length=256, description="Why, for the audit log (at most 256 characters), e.g. scheduled_rotation, suspected_leak.")


GATEWAY_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "get_skill_guide",
        "The guide to using this memory well: tools, session lifecycle, keyword rules, search strategy, "
        "episodes, case-based reasoning, triggers and anti-patterns. section= returns one section.",
        GetSkillGuideArgs, "gateway", ("guide",), "read", True,
    ),
    ToolSpec(
        "session_rotate",
        "End the current session id and issue a new one (suspected token leak or periodic rotation); "
        "the bound key, workspace and permissions carry over.",
        SessionRotateArgs, "gateway", ("session", "rotate"), "write", False, destructive=True,
    ),
)
