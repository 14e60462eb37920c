"""The fragment: one small atomic memory, and the rules that shape it on the way in."""

from __future__ import annotations

import hashlib
import secrets
import unicodedata
from typing import Literal, get_args

FragmentType = Literal["fact", "decision", "error", "preference", "procedure", "relation", "episode"]
FRAGMENT_TYPES: tuple[str, ...] = get_args(FragmentType)
Scope = Literal["permanent", "session"]
Affect = Literal["neutral", "frustration", "confidence", "surprise", "doubt", "satisfaction"]
AFFECTS: tuple[str, ...] = get_args(Affect)
ResolutionStatus = Literal["open", "resolved", "abandoned"]
AssertionStatus = Literal["observed", "inferred", "verified", "rejected"]
RelationType = Literal["related", "caused_by", "resolved_by", "part_of", "contradicts"]
RELATION_TYPES: tuple[str, ...] = get_args(RelationType)

# seed: input is accepted up to 4000 characters (else -32602) ...
MAX_CONTENT_CHARS = 4000
# ... and stored content of every type but episode is cut at 300.
STORED_CONTENT_CHARS = 300
MAX_KEYWORDS = 10
MAX_IDEMPOTENCY_KEY = 128

# Input limits of the fields the reference leaves open (README "Input limits"). Ids and
# labels are btree-indexed: 200 characters (at most 800 bytes of UTF-8) stay far below an
# index row's ~2.7 kB, and far above any id or name seen in use (fragment ids are 21).
MAX_ID_CHARS = 200
MAX_LABEL_CHARS = 200
# Keywords feed the inverted index and the BM25 terms; a keyword is a word or a short phrase.
MAX_KEYWORD_CHARS = 100
# Short free text (contextSummary, goal, outcome): one or two sentences.
MAX_SUMMARY_CHARS = 1000
# Any other string: what remember accepts as content.
MAX_TEXT_CHARS = MAX_CONTENT_CHARS
# Lists of ids or texts (linkedTo, supersedes, reflect's items, ...).
MAX_LIST_ITEMS = 100
# Integers go to Postgres bigint.
MAX_INT64 = 2**63 - 1

# Default importance by type (the reference leaves the values to config; these follow its
# ordering: errors and decisions are what an agent most needs back, episodes the least).
DEFAULT_IMPORTANCE: dict[str, float] = {
    "error": 0.8,
    "decision": 0.75,
    "procedure": 0.7,
    "preference": 0.65,
    "fact": 0.5,
    "relation": 0.5,
    "episode": 0.4,
}


def new_fragment_id() -> str:
    return f"frag-{secrets.token_hex(8)}"


def content_too_short(content: str) -> bool:
    """seed: "Content too short: length < 10 and word count < 3"."""
    stripped = content.strip()
    return len(stripped) < 10 and len(stripped.split()) < 3


def stored_content(content: str, fragment_type: str) -> str:
    content = content.strip()
    if fragment_type == "episode" or len(content) <= STORED_CONTENT_CHARS:
        return content
    return content[:STORED_CONTENT_CHARS]


def content_hash(content: str) -> str:
    normalised = " ".join(unicodedata.normalize("NFKC", content).lower().split())
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def initial_ttl_tier(*, is_anchor: bool, scope: str) -> str:
    if is_anchor:
        return "permanent"
    if scope == "session":
        return "hot"
    return "warm"


from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402


@dataclass
class NewFragment:
    """A fragment ready to insert: validated, truncated, keyworded, embedded."""

    id: str
    content: str
    topic: str
    type: str
    keywords: list[str]
    importance: float
    content_hash: str
    embedding: Any = None
    # One vector per passage (shared.domain.passages), or None/empty for a one-sentence fragment.
    passage_embeddings: Any = None
    source: str | None = None
    scope: str = "permanent"
    is_anchor: bool = False
    ttl_tier: str = "warm"
    key_id: str | None = None
    workspace: str | None = None
    workspace_source: str = "unscoped"
    agent_id: str = "default"
    session_id: str | None = None
    case_id: str | None = None
    goal: str | None = None
    outcome: str | None = None
    phase: str | None = None
    resolution_status: str | None = None
    assertion_status: str = "observed"
    affect: str = "neutral"
    context_summary: str | None = None
    valid_from: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
