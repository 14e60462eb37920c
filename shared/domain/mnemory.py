"""Reference 004's memory model (mnemory) on Engram's fragment: the mapping both ways, and the
validation rules the reference gives its fields. README "The mnemory REST API (reference 004)"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.llm import LLMClient

# reference 004 (mnemory categories.py): the predefined categories; `<prefix>:<name>` for any
# predefined prefix (project:myapp) is a dynamic subcategory.
PREDEFINED_CATEGORIES: dict[str, str] = {
    "personal": "Personal life, family, relationships, life events",
    "preferences": "Likes, dislikes, style, communication preferences",
    "health": "Physical, mental, medical, fitness, diet",
    "work": "Job, career, professional, colleagues",
    "technical": "Tools, languages, infrastructure, patterns, debugging",
    "finance": "Money, investments, billing, expenses",
    "home": "House, apartment, appliances, maintenance, repairs",
    "vehicles": "Cars, bikes, maintenance history, insurance",
    "travel": "Trips, places, itineraries, transportation",
    "entertainment": "Movies, music, books, games, hobbies",
    "goals": "Objectives, plans, ambitions, deadlines",
    "decisions": "Conclusions, choices made, reasoning, trade-offs",
    "project": "Project-specific memories (use project:<name> format)",
}
MEMORY_TYPES = ("preference", "fact", "episodic", "procedural", "context")
IMPORTANCE_LEVELS = ("low", "normal", "high", "critical")
ROLES = ("user", "assistant")
LAYERS = ("raw", "consolidated")

# memory_type -> fragment type. `context` has no fragment type: it is stored as a fact and
# named in mnemory_memories.memory_type.
FRAGMENT_TYPE = {"preference": "preference", "fact": "fact", "episodic": "episode", "procedural": "procedure", "context": "fact"}
# fragment type -> memory_type (decision, error and relation read as facts).
MEMORY_TYPE = {"preference": "preference", "procedure": "procedural", "episode": "episodic"}
# importance level -> the fragment's number, and back by the thresholds between them.
IMPORTANCE_VALUE = {"low": 0.2, "normal": 0.5, "high": 0.75, "critical": 0.95}
_IMPORTANCE_FLOORS = ((0.9, "critical"), (0.7, "high"), (0.35, "normal"))
# Fragments without a category carry this topic.
DEFAULT_TOPIC = "general"
# A category's name part: what mnemory's validate_category_name admits (no prompt text).
_CATEGORY_NAME = re.compile(r"^[a-z0-9][a-z0-9._/\-]{0,99}$")
# Labels: keys and values a client may set (reference: "key-value metadata, stored as-is").
MAX_LABELS = 20
MAX_LABEL_KEY = 64
MAX_LABEL_VALUE = 500


class ModelError(ValueError):
    """A field outside the reference's model: HTTP 422 with this message."""


def memory_type_of(fragment_type: str, stored: str | None) -> str:
    return stored or MEMORY_TYPE.get(fragment_type, "fact")


def importance_of(value: float) -> str:
    for floor, level in _IMPORTANCE_FLOORS:
        if value >= floor:
            return level
    return "low"


def validate_memory_type(value: str) -> str:
    value = value.strip().lower()
    if value not in MEMORY_TYPES:
        raise ModelError(f"Unknown memory_type '{value}'. Valid types: {', '.join(MEMORY_TYPES)}")
    return value


def validate_importance(value: str) -> str:
    value = value.strip().lower()
    if value not in IMPORTANCE_LEVELS:
        raise ModelError(f"Unknown importance '{value}'. Valid levels: {', '.join(IMPORTANCE_LEVELS)}")
    return value


def validate_categories(categories: list[str]) -> list[str]:
    out: list[str] = []
    for raw in categories:
        category = raw.strip().lower()
        if not category:
            continue
        prefix, sep, name = category.partition(":")
        if prefix not in PREDEFINED_CATEGORIES:
            valid = ", ".join(sorted(PREDEFINED_CATEGORIES))
            raise ModelError(f"Unknown category '{category}'. Valid categories: {valid}")
        if sep and not _CATEGORY_NAME.match(name):
            raise ModelError(f"Invalid category name in '{category}'")
        if category not in out:
            out.append(category)
    return out


def validate_labels(labels: dict[str, Any] | None) -> dict[str, Any]:
    if not labels:
        return {}
    if len(labels) > MAX_LABELS:
        raise ModelError(f"At most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not key or len(key) > MAX_LABEL_KEY:
            raise ModelError(f"Label keys are 1-{MAX_LABEL_KEY} characters")
        if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and len(value) > MAX_LABEL_VALUE):
            raise ModelError(f"Label '{key}': a string (at most {MAX_LABEL_VALUE} characters), number or boolean")
    return dict(labels)


def stored_labels(value: Any) -> dict[str, Any]:
    """A labels column as read back (asyncpg hands jsonb over as text)."""
    if not value:
        return {}
    return dict(json.loads(value)) if isinstance(value, str) else dict(value)


def topic_for(categories: list[str]) -> str:
    return categories[0] if categories else DEFAULT_TOPIC


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def memory_item(row: Any, score: float | None = None) -> dict[str, Any]:
    """A fragment row (shared.repositories.mnemory_memories.MEMORY_COLUMNS) as reference 004's
    MemoryItem: {id, memory, score, metadata, has_artifacts}."""
    metadata: dict[str, Any] = {
        "memory_type": memory_type_of(row["type"], row["memory_type"]),
        "categories": list(row["categories"] or []),
        "importance": importance_of(float(row["importance"])),
        "pinned": bool(row["is_anchor"]),
        "role": row["role"] or "user",
        "memory_layer": row["memory_layer"] or "consolidated",
        "created_at_utc": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }
    labels = stored_labels(row["labels"])
    if labels:
        metadata["labels"] = dict(labels)
    if row["event_date"] is not None:
        metadata["event_date"] = _iso(row["event_date"])
    if row["expires_at"] is not None:
        metadata["expires_at"] = _iso(row["expires_at"])
    if row["agent_id"] and row["agent_id"] != "default":
        metadata["agent_id"] = row["agent_id"]
    return {
        "id": row["id"],
        "memory": row["content"],
        "score": round(score, 4) if score is not None else None,
        "metadata": metadata,
        "has_artifacts": bool(row["has_artifacts"]),
    }


# -- fact extraction: /api/remember's worker job and /api/memories with infer=true ------------

# Facts one exchange yields at most.
MAX_FACTS = 20
# A sentence worth keeping: at least this long and this many words, not a question.
MIN_FACT_CHARS = 10
MIN_FACT_WORDS = 3
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_PREFERENCE = re.compile(r"\b(i|we)\s+(really\s+)?(like|love|prefer|hate|dislike|enjoy|can't stand)\b|\bfavou?rite\b", re.IGNORECASE)
_EXTRACT_SYSTEM = (
    "Extract durable facts worth remembering from a conversation. Answer with a JSON array only; each item "
    '{"content": one self-contained sentence, "role": "user" or "assistant" (whose fact it is), '
    '"memory_type": "fact" | "preference" | "episodic" | "procedural"}. Skip questions and small talk.'
)


@dataclass(frozen=True)
class Fact:
    content: str
    role: str
    memory_type: str


def speakers(request: dict[str, Any]) -> set[str]:
    """Whose facts are kept: reference 004's role (null: everyone; assistant facts only with
    an agent id, else silently dropped)."""
    role = request.get("role")
    if role == "user":
        return {"user"}
    if role == "assistant":
        return {"assistant"}
    return {"user", "assistant"} if request.get("caller_agent_id") else {"user"}


def transcript(request: dict[str, Any]) -> str:
    """User and assistant lines only: system and tool messages carry injected memories and
    raw tool output, never new facts (reference 004)."""
    return "\n".join(
        f"{m['role'].capitalize()}: {m['content']}" for m in request["messages"]
        if m.get("content") and m["role"] in ("user", "assistant")
    )


def extract_facts(request: dict[str, Any]) -> list[Fact]:
    """Deterministic extraction: each statement (not a question) of a kept speaker, prefixed
    with who said it ("User: I moved to Berlin."); "I like / prefer / hate ..." is a
    preference, everything else a fact."""
    keep = speakers(request)
    facts: list[Fact] = []
    for message in request["messages"]:
        if message["role"] not in keep or not message.get("content"):
            continue
        for part in _SENTENCE_END.split(message["content"]):
            sentence = part.strip()
            if sentence.endswith("?") or len(sentence) < MIN_FACT_CHARS or len(sentence.split()) < MIN_FACT_WORDS:
                continue
            kind = "preference" if _PREFERENCE.search(sentence) else "fact"
            facts.append(Fact(f"{message['role'].capitalize()}: {sentence}", message["role"], kind))
    return list(dict.fromkeys(facts))[:MAX_FACTS]


def llm_facts(llm: LLMClient, request: dict[str, Any]) -> list[Fact] | None:
    """The LLM's facts (when one is configured), or None to take the deterministic path."""
    if not llm.configured:
        return None
    prompt = transcript(request)
    if request.get("context"):
        prompt = f"Context: {request['context']}\n\n{prompt}"
    answer = llm.complete(_EXTRACT_SYSTEM, prompt, llm.budget(), max_tokens=800)
    if not answer:
        return None
    try:
        items = json.loads(answer[answer.find("["): answer.rfind("]") + 1])
    except ValueError:
        return None
    keep = speakers(request)
    facts = [
        Fact(str(i["content"]).strip(), i.get("role", "user"), i.get("memory_type", "fact"))
        for i in items if isinstance(i, dict) and i.get("content") and i.get("role", "user") in keep
        and i.get("memory_type", "fact") in ("fact", "preference", "episodic", "procedural")
    ]
    return facts[:MAX_FACTS]
