"""AutoReflect's deterministic extraction: a finished session's decisions, errors, procedures
and open questions turned into reflect arguments, each item remembering its source fragment.

Only what a later agent can act on is written: a tool-use tally ("used recall x193 and stored
no fragments") or a count of what was stored tells it nothing, ranked for unrelated queries
and filled lightly used keys with noise, so a session without such items leaves no fragment.
No LLM is needed; when one is configured it may only add a narrative (episode) to a session
that has items. The same session always yields the same arguments, so a redelivered job
re-stores identical content (which ingest deduplicates by content hash); a decision or
procedure handed over verbatim maps onto the fragment that already says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.fragment import STORED_CONTENT_CHARS

# seed: each reflect item is one fact/decision/procedure; cap each list so a long session
# does not become a wall of fragments.
MAX_ITEMS = 10
# Items are cut where remember cuts stored content, so a verbatim item keeps its source's
# content hash and is not stored a second time.
ITEM_CHARS = STORED_CONTENT_CHARS
REFLECT_TOPIC = "session_reflect"
CATEGORIES = ("decisions", "errors_resolved", "new_procedures", "open_questions")
# How an item that is not its source verbatim is linked to it: a resolved error's item
# carries the fix (source resolved_by item); the rest restate their source.
SOURCE_RELATION = {"errors_resolved": "resolved_by"}


@dataclass(frozen=True)
class Item:
    category: str  # one of CATEGORIES
    content: str
    source_id: str


@dataclass
class SessionDigest:
    items: list[Item] = field(default_factory=list)
    narrative_summary: str = ""  # only ever an LLM's
    workspace: str | None = None

    @property
    def empty(self) -> bool:
        return not self.items

    def reflect_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        for name in CATEGORIES:
            values = [i.content for i in self.items if i.category == name]
            if values:
                args[name] = values
        if self.narrative_summary:
            args["narrative_summary"] = self.narrative_summary
        if self.workspace is not None:
            args["workspace"] = self.workspace
        return args

    def source_links(self, stored: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """link arguments tying each stored item to its source fragment. `stored`: reflect's
        reply fragments ({id, content}); an item ingest mapped onto its source needs none."""
        ids = {f["content"]: f["id"] for f in stored}
        links = []
        for item in self.items:
            item_id = ids.get(item.content)
            if item_id is None or item_id == item.source_id:
                continue
            relation = SOURCE_RELATION.get(item.category, "related")
            if relation == "resolved_by":
                links.append({"fromId": item.source_id, "toId": item_id, "relationType": relation})
            else:
                links.append({"fromId": item_id, "toId": item.source_id, "relationType": relation})
        return links


def _cut(text: str) -> str:
    text = text.strip()
    if len(text) <= ITEM_CHARS:
        return text
    return " ".join(text.split())[: ITEM_CHARS - 1].rstrip() + "…"


def _unique(items: list[Item]) -> list[Item]:
    seen: set[tuple[str, str]] = set()
    out: list[Item] = []
    counts: Counter[str] = Counter()
    for item in items:
        key = (item.category, item.content)
        if item.content and key not in seen and counts[item.category] < MAX_ITEMS:
            seen.add(key)
            counts[item.category] += 1
            out.append(item)
    return out


def _item(f: Mapping[str, Any]) -> Item | None:
    content = f["content"]
    if f["type"] == "decision":
        return Item("decisions", _cut(content), f["id"])
    if f["type"] == "procedure":
        return Item("new_procedures", _cut(content), f["id"])
    if f["type"] != "error":
        return None
    if f.get("resolution_status") == "open":
        return Item("open_questions", _cut(f"Unresolved: {content}"), f["id"])
    if f.get("outcome"):
        return Item("errors_resolved", _cut(f"Cause: {content} -> Fix: {f['outcome']}"), f["id"])
    return Item("errors_resolved", _cut(content), f["id"])


def digest_session(fragments: Sequence[Mapping[str, Any]]) -> SessionDigest:
    """fragments: the session's, as dicts with id, type, content, topic, workspace,
    resolution_status, outcome (oldest first). Reflections of the session are not sources."""
    frags = [f for f in fragments if f.get("topic") != REFLECT_TOPIC]
    items = _unique([i for i in (_item(f) for f in frags) if i is not None])
    # Items in the reflect tool's order (category by category), each list oldest first.
    items.sort(key=lambda i: CATEGORIES.index(i.category))
    sources = {i.source_id for i in items}
    workspaces = Counter(f.get("workspace") for f in frags if f["id"] in sources and f.get("workspace"))
    return SessionDigest(items=items, workspace=workspaces.most_common(1)[0][0] if workspaces else None)


def same_session_reflections(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two reflections of one session: one account of one session, never a contradiction
    for consolidation to link (its sources' conflicts are found on the sources)."""
    return (
        a["topic"] == REFLECT_TOPIC and b["topic"] == REFLECT_TOPIC
        and a["session_id"] is not None and a["session_id"] == b["session_id"]
    )
