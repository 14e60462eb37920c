"""fsck (mnemory's memory check): the deterministic checks of one fragment, and the shape of
an issue and its fix. Duplicates and contradictions need the store and are found by the
worker; everything here works without an LLM.

An issue's fix is a list of actions, applied together:
  {"action": "delete", "id"}                       remove the fragment
  {"action": "update", "id", "content"?, "keywords"?, "topic"?, "type"?}
  {"action": "supersede", "id", "by"}              end the fragment in favour of another
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.domain.secrets import find_secrets, redact, secret_kinds

IssueType = Literal["duplicate", "contradiction", "quality", "reclassify", "security"]
Severity = Literal["low", "medium", "high"]
SEVERITY_RANK = {"low": 0, "medium": 1, "high": 2}


@dataclass
class Issue:
    issue_type: IssueType
    severity: Severity
    confidence: float
    fragment_ids: list[str]
    reason: str
    actions: list[dict[str, Any]] = field(default_factory=list)

    def qualifies(self, min_confidence: float, min_severity: Severity) -> bool:
        """auto-fsck applies only fixes at or above both thresholds."""
        return bool(self.actions) and self.confidence >= min_confidence and SEVERITY_RANK[self.severity] >= SEVERITY_RANK[min_severity]


# Prompt-injection phrasings (instructions aimed at the model that later reads the memory).
_INJECTION = [
    (re.compile(r"\b(ignore|disregard|forget)\s+(all\s+|any\s+)?(the\s+)?"
                r"(previous|prior|above|earlier)\s+(instructions|prompts|rules)", re.I), 0.97),
    (re.compile(r"\byou\s+are\s+now\s+(in\s+)?(developer|dan|jailbreak|unrestricted)", re.I), 0.95),
    (re.compile(r"\b(reveal|print|show|leak)\s+(your|the)\s+(system\s+prompt|hidden\s+instructions)", re.I), 0.95),
    (re.compile(r"<\|im_start\|>|<\|system\|>|\[INST\]|###\s*system\s*:", re.I), 0.9),
    (re.compile(r"\b(always|must)\s+(respond|answer|reply)\s+with\b.{0,40}\b(regardless|no matter)", re.I), 0.8),
    (re.compile(r"\bnew\s+instructions?\s*:", re.I), 0.75),
]

_PLACEHOLDER = re.compile(r"^\s*(test|testing|asdf+|qwerty|lorem ipsum.*|foo|bar|todo|tbd|n/?a|null|none|xxx+|\.+|-+)\s*$", re.I)
_REPEATED = re.compile(r"(.)\1{9,}")

# Phrasings that say which type a fragment really is (only ever suggested, never auto-applied:
# confidence stays under the auto-fsck default of 0.95).
_TYPE_HINTS = [
    ("decision", re.compile(r"^\s*(we\s+|i\s+|the\s+team\s+)?(decided|chose|agreed)\b|^\s*decision\s*:", re.I)),
    ("error", re.compile(r"^\s*(error|exception|traceback)\s*:|\b(failed with|threw|stack trace)\b", re.I)),
    ("procedure", re.compile(r"^\s*(runbook|how to|steps?\s*:|to\s+\w+.*:\s*\d\.)", re.I)),
    ("preference", re.compile(r"\b(prefers?|likes? to|would rather)\b", re.I)),
]


def security_issues(f: dict[str, Any]) -> list[Issue]:
    issues: list[Issue] = []
    content = f["content"]
    best = max((conf for pattern, conf in _INJECTION if pattern.search(content)), default=None)
    if best is not None:
        issues.append(Issue("security", "high", best, [f["id"]], "prompt-injection pattern in stored memory",
                            [{"action": "delete", "id": f["id"]}]))
    # The write path's rule set: memory stored before a rule existed is found the same way.
    # Redacted rather than deleted: the sentence around a secret is often the useful part.
    findings = find_secrets(content)
    if findings:
        kinds, redacted = secret_kinds(findings), redact(content, findings)
        issues.append(Issue("security", "high", 0.97, [f["id"]], f"secret in stored memory: {', '.join(kinds)}",
                            [{"action": "update", "id": f["id"], "content": redacted}]))
    return issues


def quality_issues(f: dict[str, Any]) -> list[Issue]:
    content = f["content"].strip()
    if f.get("is_anchor"):
        return []
    if _PLACEHOLDER.match(content):
        return [Issue("quality", "medium", 0.97, [f["id"]], "placeholder content", [{"action": "delete", "id": f["id"]}])]
    if len(content) < 10 and len(content.split()) < 3:
        return [Issue("quality", "medium", 0.9, [f["id"]], "content too short to mean anything", [{"action": "delete", "id": f["id"]}])]
    if _REPEATED.search(content) or not re.search(r"[A-Za-z\uAC00-\uD7A3]{2}", content):
        fix = [{"action": "delete", "id": f["id"]}]
        return [Issue("quality", "low", 0.8, [f["id"]], "content looks broken (repeated or no words)", fix)]
    return []


def normalised_keywords(keywords: list[str]) -> list[str]:
    out: list[str] = []
    for keyword in keywords:
        k = " ".join(keyword.strip().lower().split())
        if k and k not in out:
            out.append(k)
    return out


def reclassify_issues(f: dict[str, Any]) -> list[Issue]:
    issues: list[Issue] = []
    keywords = list(f.get("keywords") or [])
    fixed = normalised_keywords(keywords)
    topic = f["topic"]
    fixed_topic = " ".join(topic.split())
    update: dict[str, Any] = {}
    if fixed != keywords:
        update["keywords"] = fixed
    if fixed_topic != topic and fixed_topic:
        update["topic"] = fixed_topic
    if update:
        issues.append(Issue("reclassify", "low", 0.99, [f["id"]], "metadata not normalised (keywords / topic)",
                            [{"action": "update", "id": f["id"], **update}]))
    if f["type"] == "fact":
        for target, pattern in _TYPE_HINTS:
            if pattern.search(f["content"]):
                issues.append(Issue("reclassify", "low", 0.7, [f["id"]], f"reads like a {target}, stored as a fact",
                                    [{"action": "update", "id": f["id"], "type": target}]))
                break
    return issues
