"""reflect's rules: which category becomes which fragment type, and how task_effectiveness
is normalised before it is stored (seed: reflect / task_effectiveness)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OUTCOMES = ("completed", "partial", "blocked", "abandoned", "unknown")
EVALUATORS = ("agent", "automatic", "human")
MAX_EVIDENCE = 1000
MAX_UNMET = 20
MAX_UNMET_ITEM = 200

# Category -> (fragment type, breakdown key). Order is the order fragments are stored in.
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("summary", "fact", "summary"),
    ("decisions", "decision", "decisions"),
    ("errors_resolved", "error", "errors"),
    ("new_procedures", "procedure", "procedures"),
    ("open_questions", "fact", "questions"),
)
REFLECT_TOPIC = "session_reflect"


@dataclass
class TaskEffectiveness:
    outcome: str | None
    evaluator: str | None
    evidence: str | None
    unmet_requirements: list[str] | None
    overall_success: bool
    tool_highlights: list[str] | None
    tool_pain_points: list[str] | None


def _strings(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return None
    return [str(v) for v in value if v is not None]


def normalise_task_effectiveness(raw: dict[str, Any]) -> TaskEffectiveness:
    """seed: an outcome outside the enum is dropped (NULL); evaluator is stored only with an
    outcome and defaults to agent; evidence cut at 1000; unmet_requirements at most 20 items of
    200 chars; overall_success as given, else derived (outcome == completed)."""
    outcome = raw.get("outcome") if raw.get("outcome") in OUTCOMES else None
    evaluator = None
    if outcome is not None:
        evaluator = raw.get("evaluator") if raw.get("evaluator") in EVALUATORS else "agent"
    evidence = raw.get("evidence")
    evidence = str(evidence)[:MAX_EVIDENCE] if evidence is not None else None
    unmet = _strings(raw.get("unmet_requirements"))
    if unmet is not None:
        unmet = [item[:MAX_UNMET_ITEM] for item in unmet[:MAX_UNMET]]
    given = raw.get("overall_success")
    overall = given if isinstance(given, bool) else outcome == "completed"
    return TaskEffectiveness(
        outcome=outcome,
        evaluator=evaluator,
        evidence=evidence,
        unmet_requirements=unmet,
        overall_success=overall,
        tool_highlights=_strings(raw.get("tool_highlights")),
        tool_pain_points=_strings(raw.get("tool_pain_points")),
    )


def narrative_from_summary(summary: list[str]) -> str | None:
    """seed: narrative_summary, when omitted, is made from summary."""
    sentences = [s.strip().rstrip(".") + "." for s in summary if s and s.strip()]
    return " ".join(sentences) if sentences else None
