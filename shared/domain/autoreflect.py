"""AutoReflect's deterministic extraction: a finished session's fragments and activity turned
into reflect arguments (decisions, errors, procedures, open questions, an episode).

No LLM is needed; when one is configured it may only replace the narrative (episode) with a
better one. The same session always yields the same arguments, so a redelivered job
re-stores identical content (which ingest deduplicates by content hash).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# seed: each reflect item is one fact/decision/procedure; cap each list so a long session
# does not become a wall of fragments.
MAX_ITEMS = 10
ITEM_CHARS = 280
REFLECT_TOPIC = "session_reflect"


@dataclass
class SessionDigest:
    decisions: list[str] = field(default_factory=list)
    errors_resolved: list[str] = field(default_factory=list)
    new_procedures: list[str] = field(default_factory=list)
    open_questions: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    narrative_summary: str = ""
    workspace: str | None = None
    fragment_count: int = 0

    @property
    def empty(self) -> bool:
        return self.fragment_count == 0 and not self.summary

    def reflect_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {"summary": self.summary, "narrative_summary": self.narrative_summary}
        for name in ("decisions", "errors_resolved", "new_procedures", "open_questions"):
            if getattr(self, name):
                args[name] = getattr(self, name)
        if self.workspace is not None:
            args["workspace"] = self.workspace
        return args


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ITEM_CHARS else text[: ITEM_CHARS - 1].rstrip() + "…"


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out[:MAX_ITEMS]


def _duration(started: datetime | None, ended: datetime | None) -> str | None:
    if started is None or ended is None:
        return None
    minutes = max(0, int((ended - started).total_seconds() // 60))
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def digest_session(
    session_id: str,
    fragments: list[dict[str, Any]],
    activity: list[dict[str, Any]],
    *,
    reason: str | None,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
) -> SessionDigest:
    """fragments: dicts with type, content, topic, workspace, resolution_status, outcome,
    created_at (oldest first); activity: the gateway's [{"tool", "at"}] entries."""
    frags = [f for f in fragments if f.get("topic") != REFLECT_TOPIC]
    digest = SessionDigest(fragment_count=len(frags))
    by_type: dict[str, list[dict[str, Any]]] = {}
    for f in frags:
        by_type.setdefault(f["type"], []).append(f)

    digest.decisions = _unique([_cut(f["content"]) for f in by_type.get("decision", [])])
    errors, open_questions = [], []
    for f in by_type.get("error", []):
        if f.get("resolution_status") == "open":
            open_questions.append(_cut(f"Unresolved: {f['content']}"))
        elif f.get("outcome"):
            errors.append(_cut(f"Cause: {f['content']} -> Fix: {f['outcome']}"))
        else:
            errors.append(_cut(f["content"]))
    digest.errors_resolved = _unique(errors)
    digest.open_questions = _unique(open_questions)
    digest.new_procedures = _unique([_cut(f["content"]) for f in by_type.get("procedure", [])])

    workspaces = Counter(f.get("workspace") for f in frags if f.get("workspace"))
    digest.workspace = workspaces.most_common(1)[0][0] if workspaces else None
    topics = Counter(f["topic"] for f in frags)
    tools = Counter(str(a.get("tool")) for a in activity if isinstance(a, dict) and a.get("tool"))

    if not frags and not tools:
        return digest
    counts = ", ".join(f"{len(v)} {k}{'s' if len(v) != 1 else ''}" for k, v in sorted(by_type.items()))
    topic_list = ", ".join(t for t, _ in topics.most_common(5))
    tool_list = ", ".join(f"{t} x{n}" for t, n in tools.most_common(6))
    duration = _duration(started_at, ended_at)

    if frags:
        digest.summary = [_cut(f"Session {session_id} stored {len(frags)} fragments ({counts}) on {topic_list}.")]
    else:
        digest.summary = [_cut(f"Session {session_id} used {tool_list} and stored no fragments.")]

    sentences = [
        f"Session {session_id} ended ({reason or 'ended'})" + (f" after {duration}" if duration else "") + "."
    ]
    if frags:
        sentences.append(f"It stored {len(frags)} fragments ({counts}) about {topic_list}.")
    if tools:
        sentences.append(f"Tools used: {tool_list}.")
    if digest.decisions:
        sentences.append(f"Key decision: {digest.decisions[0].rstrip('.')}.")
    if digest.errors_resolved:
        sentences.append(f"Error handled: {digest.errors_resolved[0].rstrip('.')}.")
    elif digest.open_questions:
        sentences.append(f"Left open: {digest.open_questions[0].rstrip('.')}.")
    digest.narrative_summary = " ".join(sentences[:5])
    return digest
