"""When two near-identical fragments may merge, and when two similar ones contradict.

Pure functions over text: the consolidation stages and fsck both decide with these, and a
test can check a rule without a database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.domain.keywords import STOPWORDS

# Cosine similarity (MiniLM, normalised) at or above which two fragments of one tenant and
# topic are the same memory said twice. Paraphrases of one fact land at 0.93-0.99; two facts
# that differ in one number or name also land there, which is what the safety gate is for.
SEMANTIC_DUPLICATE_MIN = 0.93
# Similar enough to be about the same thing, so a negation or a changed number is a conflict.
CONTRADICTION_MIN = 0.80

_WORD = re.compile(r"[0-9A-Za-z\u00C0-\u024F\uAC00-\uD7A3][0-9A-Za-z\u00C0-\u024F\uAC00-\uD7A3_\-\./:]*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset(
    [
        "not", "no", "never", "none", "cannot", "can't", "don't", "doesn't", "didn't", "isn't", "aren't", "wasn't",
        "weren't", "won't", "shouldn't", "mustn't", "without", "disabled", "안", "않", "못", "없",
    ]
)
# Word pairs whose swap flips a statement's meaning.
_ANTONYMS = (
    ("enabled", "disabled"), ("enable", "disable"), ("true", "false"), ("on", "off"), ("allow", "deny"),
    ("allowed", "denied"), ("allow", "block"), ("use", "avoid"), ("always", "never"), ("accept", "reject"),
    ("accepted", "rejected"), ("increase", "decrease"), ("before", "after"), ("sync", "async"),
    ("public", "private"), ("required", "optional"), ("likes", "dislikes"), ("prefers", "avoids"),
    ("succeeded", "failed"), ("open", "closed"), ("up", "down"), ("yes", "no"),
)


def words(text: str) -> list[str]:
    return [w.strip(".-:/_") for w in _WORD.findall(text)]


def _normal(word: str) -> str:
    word = word.lower()
    return word[:-2] if word.endswith("'s") else word


def distinctive_tokens(text: str) -> set[str]:
    """Tokens that carry a specific fact: numbers, versions, identifiers, names, acronyms.

    Two texts can embed within a hair of each other and still differ in exactly these
    ("Postgres 15" vs "Postgres 16", "Alice owns billing" vs "Bongsu owns billing"), so a
    merge must never drop one of them.
    """
    found: set[str] = set()
    for raw in _WORD.findall(text):
        word = raw.strip(".-:/_")
        if not word:
            continue
        lower = _normal(word)
        if any(c.isdigit() for c in word) or any(c in word for c in "_./:") or (
            "-" in word and len(word) > 3
        ) or (word.isupper() and len(word) >= 2):
            found.add(lower)
        elif word[0].isupper() and lower not in STOPWORDS:
            # Names and products; a capitalised sentence opener counts too ("Alice owns ..."):
            # the gate only asks that the survivor carries the word somewhere.
            found.add(lower)
    return found


def missing_distinctive(removed: str, survivor: str) -> set[str]:
    """The safety gate: distinctive tokens of `removed` that `survivor` does not carry."""
    have = {_normal(w) for w in words(survivor)}
    survivor_lower = survivor.lower()
    return {t for t in distinctive_tokens(removed) if t not in have and t not in survivor_lower}


@dataclass(frozen=True)
class MergeDecision:
    allowed: bool
    survivor: str
    removed: str
    missing: tuple[str, ...] = ()


def decide_merge(a: dict, b: dict) -> MergeDecision:
    """Pick the survivor (anchor, then importance, then use, then age) and apply the gate.

    `a`/`b` carry id, content, is_anchor, importance, access_count, created_at. When the
    preferred survivor lacks a distinctive token of the other, the reverse direction is
    tried; when both lose something, the merge is blocked.
    """
    def rank(f: dict) -> tuple:
        return (bool(f["is_anchor"]), float(f["importance"]), int(f["access_count"] or 0), -f["created_at"].timestamp())

    first, second = (a, b) if rank(a) >= rank(b) else (b, a)
    if second["is_anchor"]:
        # Two anchors never merge: each was pinned on purpose.
        return MergeDecision(False, first["id"], second["id"], ("<anchor>",))
    missing = missing_distinctive(second["content"], first["content"])
    if not missing:
        return MergeDecision(True, first["id"], second["id"])
    if not first["is_anchor"]:
        reverse = missing_distinctive(first["content"], second["content"])
        if not reverse:
            return MergeDecision(True, second["id"], first["id"])
    return MergeDecision(False, first["id"], second["id"], tuple(sorted(missing)))


@dataclass(frozen=True)
class Contradiction:
    signal: str
    confidence: float
    detail: str


def _tokens(text: str) -> list[str]:
    return [_normal(w) for w in words(text)]


def contradiction_signal(a: str, b: str) -> Contradiction | None:
    """Deterministic conflict signals between two similar statements, or None.

    - negation: one side negates ("not", "never", "disabled", ...) and the other doesn't,
      over otherwise overlapping words;
    - antonym: a word is swapped for its opposite (enabled/disabled, allow/deny, ...);
    - value: the same statement with a different number (a version, a limit, a port).
    """
    ta, tb = _tokens(a), _tokens(b)
    sa, sb = set(ta), set(tb)
    content_a = {t for t in sa if t not in STOPWORDS and t not in _NEGATIONS}
    content_b = {t for t in sb if t not in STOPWORDS and t not in _NEGATIONS}
    if not content_a or not content_b:
        return None
    overlap = len(content_a & content_b) / min(len(content_a), len(content_b))
    neg_a, neg_b = bool(sa & _NEGATIONS), bool(sb & _NEGATIONS)
    if neg_a != neg_b and overlap >= 0.6:
        return Contradiction("negation", round(min(0.95, 0.5 + overlap / 2), 3), "one statement negates the other")
    for x, y in _ANTONYMS:
        swapped = (x in sa and y in sb and y not in sa and x not in sb) or (y in sa and x in sb and x not in sa and y not in sb)
        if swapped and overlap >= 0.5:
                return Contradiction("antonym", round(min(0.9, 0.45 + overlap / 2), 3), f"{x} vs {y}")
    nums_a = set(_NUMBER.findall(a))
    nums_b = set(_NUMBER.findall(b))
    # Each side has a number the other lacks ("version 16" vs "version 15", 32 GB on both).
    if nums_a - nums_b and nums_b - nums_a:
        words_a = content_a - nums_a
        words_b = content_b - nums_b
        if words_a and words_b:
            word_overlap = len(words_a & words_b) / min(len(words_a), len(words_b))
            if word_overlap >= 0.7:
                return Contradiction(
                    "value", round(min(0.9, 0.4 + word_overlap / 2), 3),
                    f"{', '.join(sorted(nums_a - nums_b))} vs {', '.join(sorted(nums_b - nums_a))}",
                )
    return None
