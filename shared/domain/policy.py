"""The symbolic policy gate of remember (seed: MEMENTO_SYMBOLIC_POLICY_RULES).

Soft by default: failed predicates become `validation_warnings` and the fragment is stored.
A key with `symbolic_hard_gate` refuses such a fragment with -32003. `workspaceNotAllowed`
is evaluated whatever the setting and never gates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DECISION_HAS_RATIONALE = "decisionHasRationale"
ERROR_HAS_RESOLUTION_PATH = "errorHasResolutionPath"
PROCEDURE_HAS_STEP_MARKERS = "procedureHasStepMarkers"
CASE_ID_HAS_RESOLUTION_STATUS = "caseIdHasResolutionStatus"
ASSERTION_NOT_CONTRADICTORY = "assertionNotContradictory"
FRAGMENT_HAS_WORKSPACE = "fragmentHasWorkspace"
WORKSPACE_NOT_ALLOWED = "workspaceNotAllowed"

_RATIONALE = re.compile(
    r"\b(because|since|so that|due to|in order to|to avoid|to prevent|to keep|reason|rationale|why|given that|"
    r"as a result|trade-?off|instead of)\b|때문|이유|위해|근거|덕분|므로|니까",
    re.I,
)
_CAUSE_OR_FIX = re.compile(
    r"\b(cause[sd]?|caused by|root cause|fix(e[sd])?|fixing|resolved?|solution|workaround|patch(ed)?|"
    r"because|due to|→|->)|원인|해결|수정|조치|우회",
    re.I,
)
_STEP_MARKERS = re.compile(
    r"(^|\s)(\d+[.)]|[①-⑳]|step\s*\d+|first(ly)?\b|then\b|next\b|finally\b|->|→|=>)|단계|먼저|다음|마지막",
    re.I,
)
_NEGATION = re.compile(
    r"\b(not|never|no|none|cannot|can't|don't|doesn't|isn't|aren't|wasn't|won't|without|disabled?|false)\b|"
    r"않|없|못|아니|안 ",
    re.I,
)


@dataclass(frozen=True)
class PolicySubject:
    type: str
    content: str
    linked_to: int
    case_id: str | None
    resolution_status: str | None
    workspace_source: str


def polarity(text: str) -> bool:
    """True for an affirmative statement, False for a negated one (odd count of negations)."""
    return len(_NEGATION.findall(text)) % 2 == 0


def evaluate(subject: PolicySubject, similar_contents: list[str]) -> list[str]:
    """The failed predicates, in the seed's order. `similar_contents` are the live fragments
    the new one is nearly identical to (its conflicts)."""
    failed: list[str] = []
    if subject.type == "decision" and subject.linked_to < 2 and not _RATIONALE.search(subject.content):
        failed.append(DECISION_HAS_RATIONALE)
    if subject.type == "error" and subject.resolution_status is None and not _CAUSE_OR_FIX.search(subject.content):
        failed.append(ERROR_HAS_RESOLUTION_PATH)
    if subject.type == "procedure" and not _STEP_MARKERS.search(subject.content):
        failed.append(PROCEDURE_HAS_STEP_MARKERS)
    if subject.case_id is not None and subject.resolution_status is None:
        failed.append(CASE_ID_HAS_RESOLUTION_STATUS)
    mine = polarity(subject.content)
    if any(polarity(other) != mine for other in similar_contents):
        failed.append(ASSERTION_NOT_CONTRADICTORY)
    if subject.workspace_source == "unscoped":
        failed.append(FRAGMENT_HAS_WORKSPACE)
    return failed


def gating(violations: list[str], *, workspace_gate: bool) -> list[str]:
    """The violations a hard-gated key refuses: fragmentHasWorkspace only with
    MEMENTO_WORKSPACE_GATE, workspaceNotAllowed never."""
    return [
        v for v in violations
        if v != WORKSPACE_NOT_ALLOWED and (v != FRAGMENT_HAS_WORKSPACE or workspace_gate)
    ]
