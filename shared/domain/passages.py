"""A fragment's passages: pairs of its consecutive sentences, each under the fragment's lead.

A fragment's embedding is one vector for all of it, so a question about one of its sentences
meets that sentence diluted by the rest. Recall also compares the question with each
passage and mixes the best passage's similarity into the fragment's (best-passage scoring,
"MaxP": Dai & Callan 2019). A passage keeps the fragment's lead (`[date] Melanie:` in
`[date] Melanie: ...`, `Decision:` in `Decision: ...`: whatever precedes the first ": " in
the first LEAD_MAX characters), because a sentence without its speaker, subject or date loses
what the question names. LoCoMo dev, recall@10 over three ingested copies: bare single sentences
+0.004; single sentences under the lead +0.010-0.015; pairs under the lead the same (+0.010-0.018) with
half the passages, so half the extra embedding work of a write. Content of one or two
sentences has no passages: a pair would be the fragment itself.
"""

from __future__ import annotations

import re
from typing import Any

LEAD_MAX = 120
# A label names (a speaker, a service, "User preference"); a longer lead is a clause.
LABEL_WORDS = 4
SENTENCES_PER_PASSAGE = 2
# Long content is cut into at most this many passages, bounding the extra embedding work of
# a write (a fragment's content is at most a few thousand characters).
MAX_PASSAGES = 8
_STAMP = re.compile(r"^\[[^\]]*\]\s*")
_BREAK = re.compile(r"(?<=[.!?\u3002\uff01\uff1f])\s+|\n+")


def lead_of(content: str) -> str:
    """`[date] Melanie:` of `[date] Melanie: text`: the text before the first ": " if that is
    within LEAD_MAX characters and not a sentence of its own (`It failed. Owner: Alice.` has
    none), with its colon; else ""."""
    colon = content.find(": ")
    lead = content[: colon + 1] if 0 < colon < LEAD_MAX else ""
    return "" if _BREAK.search(lead) else lead


def label_of(content: str) -> str:
    """The fragment's label: its lead without the colon and without a leading bracketed stamp
    (`Melanie` of `[1:14 pm on 25 May, 2023] Melanie: ...`, `Decision` of `Decision: ...`).
    Only the first LEAD_MAX + 1 characters are needed."""
    label = _STAMP.sub("", lead_of(content)[:-1]).strip()
    return label if ":" not in label and len(label.split()) <= LABEL_WORDS else ""


def passages(content: str) -> list[str]:
    """The passages of `content`; [] when it is its own only passage."""
    lead = lead_of(content)
    body = content[len(lead):].strip()
    sentences = [s.strip() for s in _BREAK.split(body) if s.strip()]
    if len(sentences) <= SENTENCES_PER_PASSAGE:
        return []
    size = max(SENTENCES_PER_PASSAGE, -(-len(sentences) // MAX_PASSAGES))
    return [" ".join([lead, *sentences[i:i + size]]).strip() for i in range(0, len(sentences), size)]


def embedding_text(topic: str | None, content: str) -> str:
    """What a fragment's embedding is computed from."""
    return f"{topic}: {content}" if topic else content


def embedding_inputs(items: list[tuple[str | None, str]]) -> tuple[list[str], list[tuple[int, int]]]:
    """The texts to embed for (topic, content) pairs: first each fragment's own text, then
    the passages, with where each fragment's passages start and how many there are."""
    texts = [embedding_text(topic, content) for topic, content in items]
    spans = []
    for _topic, content in items:
        parts = passages(content)
        spans.append((len(texts), len(parts)))
        # Without the topic: the fragment's own embedding carries it, and on LoCoMo dev
        # passages scored the same with or without it, for fewer tokens to embed.
        texts.extend(parts)
    return texts, spans


def pooled_inputs(items: list[tuple[str | None, str]]) -> tuple[list[str], list[tuple[int, int]]]:
    """The texts to embed when a fragment with passages takes its embedding from them (the
    mean of the token states of all its passages' runs, shared.embeddings.model.pooled)
    instead of a run of its own: a fragment without passages embeds its own text, one with
    passages only its passages. Per fragment: (where its texts start, how many are passages;
    0 = one text, its own)."""
    texts: list[str] = []
    spans = []
    for topic, content in items:
        parts = passages(content)
        spans.append((len(texts), len(parts)))
        texts.extend(parts or [embedding_text(topic, content)])
    return texts, spans


def split_vectors(vectors: Any, spans: list[tuple[int, int]]) -> list[tuple[Any, Any]]:
    """`embedding_inputs`' vectors back per fragment: (its embedding, its passages' rows)."""
    return [(vectors[i], vectors[start:start + n]) for i, (start, n) in enumerate(spans)]
