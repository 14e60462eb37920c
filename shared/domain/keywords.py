"""Keyword extraction: the words of a fragment worth matching exactly later."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Any

# Small English stop list: function words and chat filler that would match everything.
STOPWORDS = frozenset(
    [
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "aren't", "as",
        "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "can't",
        "cannot", "could", "couldn't", "did", "didn't", "do", "does", "doesn't", "doing", "don't", "down", "during",
        "each", "few", "for", "from", "further", "get", "got", "had", "hadn't", "has", "hasn't", "have", "haven't",
        "having", "he", "he'd", "he'll", "he's", "her", "here", "here's", "hers", "herself", "him", "himself", "his",
        "how", "how's", "i", "i'd", "i'll", "i'm", "i've", "if", "in", "into", "is", "isn't", "it", "it's", "its",
        "itself", "just", "let's", "like", "me", "more", "most", "much", "my", "myself", "no", "nor", "not", "now",
        "of", "off", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves", "out", "over", "own",
        "really", "same", "shan't", "she", "she'd", "she'll", "she's", "should", "shouldn't", "so", "some", "such",
        "than", "that", "that's", "the", "their", "theirs", "them", "themselves", "then", "there", "there's", "these",
        "they", "they'd", "they'll", "they're", "they've", "this", "those", "through", "to", "too", "under", "until",
        "up", "us", "very", "was", "wasn't", "we", "we'd", "we'll", "we're", "we've", "were", "weren't", "what",
        "what's", "when", "when's", "where", "where's", "which", "while", "who", "who's", "whom", "why", "why's",
        "will", "with", "won't", "would", "wouldn't", "yeah", "yes", "you", "you'd", "you'll", "you're", "you've",
        "your", "yours", "yourself", "yourselves", "also", "oh", "ok", "okay", "hey", "hi", "thanks", "thank", "well",
        "lot", "lots", "still", "even", "ever", "one", "two", "go", "going", "gonna", "want", "wanna", "know", "think",
        "thing", "things", "something", "anything", "make", "made", "way", "yet",
    ]
)

_TOKEN = re.compile(r"[0-9A-Za-z\u00C0-\u024F\uAC00-\uD7A3][0-9A-Za-z\u00C0-\u024F\uAC00-\uD7A3_\-\.']*")
# Korean particles (josa) that stick to nouns; stripped so "서버가" and "서버를" meet as "서버".
_KO_PARTICLES = (
    "으로부터", "에서부터", "에게서", "으로써", "으로서", "이라고", "에서는", "에서도", "까지는",
    "으로", "에서", "에게", "한테", "까지", "부터", "처럼", "보다", "이나", "이랑", "라고", "과는", "와는",
    "은", "는", "이", "가", "을", "를", "의", "에", "와", "과", "도", "로", "만", "랑",
)


def _strip_korean_particle(token: str) -> str:
    if not re.search(r"[\uAC00-\uD7A3]$", token):
        return token
    for particle in _KO_PARTICLES:
        if token.endswith(particle) and len(token) - len(particle) >= 2:
            return token[: -len(particle)]
    return token


_HANGUL = re.compile(r"[\uAC00-\uD7A3]")
# Morpheme tags kept as content words: nouns, foreign words, numbers, verb/adjective stems.
# Particles (J*), endings (E*) and affixes (X*) are what polluted keywords before.
_KO_CONTENT_TAGS = ("NNG", "NNP", "SL", "SN", "SH", "VV", "VA", "XR")


@lru_cache(maxsize=1)
def _kiwi() -> Any | None:
    """The Korean morpheme analyser, loaded on first Korean text (~2 s, then ~1 ms a call)."""
    try:
        from kiwipiepy import Kiwi
    except ImportError:  # optional at import: the particle stripper below still works
        return None
    return Kiwi(num_workers=0)


def korean_morphemes(text: str) -> list[str] | None:
    """Content morphemes of Korean text ("서버가 재시작되어" -> 서버, 시작), or None without kiwipiepy."""
    kiwi = _kiwi()
    if kiwi is None:
        return None
    out = []
    for token in kiwi.tokenize(text):
        if token.tag in _KO_CONTENT_TAGS:
            form = token.form.lower()
            if (len(form) >= 2 or _HANGUL.search(form)) and form not in STOPWORDS:
                out.append(form)
    return out


def tokenize(text: str) -> list[str]:
    if _HANGUL.search(text):
        morphemes = korean_morphemes(text)
        if morphemes is not None:
            # Single-syllable Korean nouns are mostly noise as keywords (것, 수, 때).
            return [m for m in morphemes if len(m) >= 2]
    tokens = []
    for raw in _TOKEN.findall(text.lower()):
        token = raw.strip(".-'_")
        if token.endswith("'s"):
            token = token[:-2]
        token = _strip_korean_particle(token)
        if len(token) < 2 or token in STOPWORDS:
            continue
        tokens.append(token)
    return tokens


def extract_keywords(text: str, limit: int = 10) -> list[str]:
    """Most frequent content words, ties broken by first appearance."""
    tokens = tokenize(text)
    counts = Counter(tokens)
    first_seen = {t: i for i, t in reversed(list(enumerate(tokens)))}
    ranked = sorted(counts, key=lambda t: (-counts[t], first_seen[t]))
    return ranked[:limit]


def merge_keywords(given: list[str] | None, content: str, limit: int = 10) -> list[str]:
    """seed: given keywords first, then those extracted from content; deduplicated; at most 10."""
    merged: list[str] = []
    seen: set[str] = set()
    for keyword in [*(given or []), *extract_keywords(content, limit)]:
        normalised = keyword.strip().lower()
        if normalised and normalised not in seen:
            seen.add(normalised)
            merged.append(normalised)
        if len(merged) >= limit:
            break
    return merged
