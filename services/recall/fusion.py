"""Fusing the search layers into one ranking.

Every pooled fragment (the layers' candidates, the turns next to them, and theirs) gets a
lexical feature — half its own BM25, half a "window" BM25 over itself plus half its
neighbouring turns' term counts, so an answer split over two adjacent turns still matches —
and a semantic one: its cosine to the query, 0.3 of it its best passage's
(shared.domain.passages). Both are z-scored over the pool and mixed evenly; a candidate then
borrows from its better neighbouring turn, and a reply from the question turn it
answers; a query naming its label (speaker or subject)
adds a field bonus, a fragment that mostly asks questions loses a little (a question's words
match the turn that asked it; the reply holds the answer), and importance, activation and
recency add small bounded terms. One
round of RM3 pseudo-relevance feedback (Lavrenko & Croft 2001;
Abdul-Jaleel et al. 2004) adds the ten terms that best characterise the first ranking's top
hits and rescores the same pool, the expansion counted for the first ranking's head only.

Measured on the LoCoMo dev turns (recall@10, categories 1-4; both conversations moved alike):
BM25 0.64, dense MiniLM 0.45, min-max linear mix + neighbour borrowing 0.74; z-scores 0.746,
+ neighbours as candidates 0.759, + RM3 0.774, + window BM25 0.786, neighbour weight 0.3 and
borrowing clamped at 0: 0.794; RM3 reordering only the head (RM3_RESCORE): +0.003-0.008;
best-passage similarity (PASSAGE_MIX) +0.010; the label field (LABEL_WEIGHT) +0.010.
Every constant started as a textbook or round default (RM3: feedback docs = default pageSize,
10 terms, 0.3 interpolation, the head = the layer depth); a 12-point grid around them scored
0.779-0.800 and leave-one-conversation-out tuning landed on the same point. Since then some
were chosen leave-one-conversation-out on all ten LoCoMo conversations (bench/README,
"Retrieval on unseen conversations"): each says so where it is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from shared.domain.search import RankedHit
from shared.repositories.retrieval import BM25_B, BM25_K1

# Reciprocal-rank fusion constant (Cormack et al. 2009), for rankings without comparable scores.
RRF_K = 60

LEXICAL_WEIGHT = 0.5
SEMANTIC_WEIGHT = 0.5
# The semantic feature is z-scored by its spread over the pool, but never by less than this
# (cosine units). A pool of near-identical fragments (templated bulk rows: cosines 0.40-0.41,
# sd ~0.005) made a few hundredths of cosine worth several standard deviations, and the one
# fragment holding a unique keyword, its cosine 0.2 lower, lost ~20 z to them: a keyword
# recall ranked it below the first page, under rows without the word.
SEMANTIC_SD_FLOOR = 0.05
NEIGHBOUR_WEIGHT = 0.3
# A neighbouring turn's term counts and length enter a fragment's window BM25 at this weight;
# the lexical feature mixes own and window BM25 (each divided by its pool maximum) this way.
WINDOW_GAMMA = 0.5
WINDOW_MIX = 0.5
# RM3: the first ranking's top RM3_FEEDBACK are taken as relevant; the RM3_PRESELECT terms
# weighing most in them have their document frequency looked up; the RM3_TERMS best by
# weight x IDF join the query, an average one at RM3_WEIGHT x its IDF. The top hits' words
# include what they share besides the answer (a session's date in the lead, the other
# speaker's name, small talk), and at 0.3 ten of them could lift a fragment holding none of
# the question's words over one that does. 0.3 -> 0.1 chosen leave-one-conversation-out on
# the ten LoCoMo conversations with QUESTION_WEIGHT: see there for the numbers.
RM3_FEEDBACK = 10
RM3_PRESELECT = 40
RM3_TERMS = 10
RM3_WEIGHT = 0.1
# Only the first ranking's top this-many (the layer depth) get the expansion terms' counts:
# LoCoMo dev, three ingested copies, whole pool -> head: 0.7925 / 0.7921 / 0.7878 ->
# 0.7968 / 0.7997 / 0.7911 (30: ~+0.002, 45: ~+0.006, 80: ~+0.001, 100: +-0).
RM3_RESCORE = 60
# A fragment with several sentences (shared.domain.passages) is as similar to the query as
# its own embedding says, this much of it replaced by its best passage's similarity. LoCoMo
# dev, three ingested copies, recall@10 without -> with: 0.789 / 0.787 / 0.791 ->
# 0.801 / 0.806 / 0.802 at 0.3 (0.2-0.5 all gain 0.008-0.015; the best passage alone +0.002;
# passages as extra vector-layer candidates: +-0). 0.3 -> 0.5 chosen leave-one-conversation-out
# on all ten LoCoMo conversations (bench.locomo_rescore, bench/README "Retrieval on unseen
# conversations"): unseen eight 0.764 / MRR 0.543 -> 0.766 / 0.551, dev recall equal, MRR up.
PASSAGE_MIX = 0.5
# A query term naming a fragment's label (passages.label_of: the speaker of `Melanie: ...`, the
# subject of `billing-api: ...`) is a field match, worth more than the same word in the prose
# where that name is everywhere (BM25F's field weights, Robertson et al. 2004, as one bounded
# term). LoCoMo dev with passages, three copies: 0.800 / 0.804 / 0.794 -> 0.811 / 0.812 /
# 0.804 at 0.2 (0.1: about half of that). 0.2 -> 1.0 chosen leave-one-conversation-out on all
# ten LoCoMo conversations (grid 0.2-1.0, the largest won everywhere): unseen eight 0.764 / MRR
# 0.543 -> 0.777 / 0.583, dev 0.804 -> 0.809; adversarial questions, which name the wrong
# speaker on purpose, 0.889 -> ~0.84.
LABEL_WEIGHT = 1.0
# A fragment whose text is all questions (`Wow! How did you get into painting?`) matches a
# question's words but rarely holds its answer: it loses QUESTION_WEIGHT x the share of its
# text in question sentences (shared.domain.search.question_share); the reply after it still
# borrows from its score. LoCoMo, leave-one-conversation-out over 0 / 0.2 / 0.4: 0.4 everywhere;
# dev 0.804 / MRR 0.544 -> 0.810 / 0.557 (both conversations up), unseen eight MRR 0.543 -> 0.565
# (recall@10 0.764 -> 0.763). 0.4 -> 0.8 with RM3_WEIGHT 0.3 -> 0.1, chosen the same way on
# replayed pools (grid RM3_WEIGHT 0.1 / 0.15 / 0.3 x 0.4 / 0.8; the held-out pick for 9 of the
# 10 conversations, 0.15 / 0.8 for the tenth). In process on one store: unseen eight 0.776 /
# MRR 0.594 -> 0.786 / 0.607, conv-26 0.811 / 0.556 -> 0.815 / 0.562, conv-30 0.808 / 0.628 ->
# 0.808 / 0.644 (recall@10 equal), adversarial 0.836 -> 0.836.
QUESTION_WEIGHT = 0.8
# A reply borrows from the question it answers: a fragment gains QA_WEIGHT x the previous
# turn's share of question sentences x that turn's base score (if positive) x the share of its
# own text that does not ask. "How did the deploy go?" holds the query's words, the reply the
# answer; a reply that only asks back gains nothing. LoCoMo, ten conversations on one store, in
# process (bench.locomo_rescore), 0 / 0.1 / 0.2 / 0.3: unseen eight 0.801 / MRR 0.614, 0.804 /
# 0.618, 0.803 / 0.622, 0.802 / 0.624; conv-26 0.839 / 0.582 -> 0.839 / 0.585 at 0.2 (recall@10
# equal), conv-30 0.818 / 0.633 -> 0.824 / 0.641; adversarial 0.853 -> 0.862. Leave-one-
# conversation-out: 0.2 for eight held-out conversations, pooled 0.807 / 0.619; through MCP on
# the same store unseen eight 0.800 / 0.613 -> 0.803 / 0.622. Without the own-asks factor, on
# an earlier store, conv-30 fell at 0.2 (bench/README, fifth round).
QA_WEIGHT = 0.2
# A question that asks when (search.asks_when: "When did ...", "How long ago ...", "In which
# year ...") is answered by a fragment that says when (search.TIME_LEXEMES): in conversation
# that is a relative time ("last week", "yesterday", "two years ago"); a session's own date is in
# every turn's lead, so the lead's absolute date says nothing and months are not counted. Such a
# fragment gains TIME_ANSWER_WEIGHT. LoCoMo, questions asking when: 83% of their evidence turns
# among the top 10 say a relative time, 28% of the other turns there. Ten conversations on one
# store, in process (bench.locomo_rescore), 0 -> 1.0: unseen eight 0.793 / MRR 0.607 -> 0.800 /
# 0.614, conv-26 0.833 / 0.577 -> 0.839 / 0.580, conv-30 0.830 / 0.637 -> 0.830 / 0.636 (its
# when-questions already found their turn), temporal 0.832 -> 0.861, the other categories
# +-0.002; no conversation lower. Leave-one-conversation-out over 0 / 0.5 / 1.0 / 1.5 / 2.0: 1.0
# for nine held-out conversations, 1.5 for the tenth (bench/README, "Retrieval on unseen
# conversations", fourth round). Measured as a bonus after RM3; in both rankings, as here, the
# fifth round's second store scored the same.
TIME_ANSWER_WEIGHT = 1.0
# Bounded priors: on the z scale they only order near-ties.
IMPORTANCE_WEIGHT = 0.02
ACTIVATION_WEIGHT = 0.02
RECENCY_WEIGHT = 0.01
RECENCY_HALF_LIFE_DAYS = 30.0


@dataclass
class PoolRow:
    """A pooled fragment as ranking sees it."""

    id: str
    tf: dict[str, int]  # positions of each query (and expansion) term
    dl: int  # distinct lexemes (length(search_tsv))
    cosine: float | None
    importance: float
    activation: float
    age_days: float
    prev: str | None = None  # neighbouring turns in the same session (seq order), if pooled
    next: str | None = None
    passage_cosine: float | None = None  # its best passage's cosine, if it has passages
    names_label: bool = False  # the query names its label (speaker or subject)
    asks: float = 0.0  # share of its text in question sentences
    says_when: bool = False  # the query asks when and its text says a relative time

    @property
    def similarity(self) -> float | None:
        """The semantic feature: the fragment's cosine, PASSAGE_MIX of it its best passage's."""
        if self.cosine is None or self.passage_cosine is None:
            return self.cosine
        return (1 - PASSAGE_MIX) * self.cosine + PASSAGE_MIX * self.passage_cosine


@dataclass
class Pool:
    candidates: dict[str, set[str]]  # id -> layers that proposed it
    rows: dict[str, PoolRow]
    avgdl: float
    ids: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = list(self.rows)


def _bm25(tf: np.ndarray, dl: np.ndarray, idf: np.ndarray, avgdl: float) -> np.ndarray:
    norm = BM25_K1 * (1 - BM25_B + BM25_B * dl / max(avgdl, 1.0))
    return ((tf * (BM25_K1 + 1)) / (tf + norm[:, None] + 1e-12) * idf[None, :]).sum(axis=1)


def _index(at: dict[str, int], fid: str | None) -> int:
    """A pooled neighbour's row, or -1 (the appended zero row) when it has none in the pool."""
    return at.get(fid, -1) if fid else -1


def _z(x: np.ndarray, floor: float = 0.0) -> np.ndarray:
    sd = max(float(x.std()), floor)
    return (x - x.mean()) / (sd if sd > 1e-12 else 1.0)


def score(pool: Pool, idf: dict[str, float]) -> list[RankedHit]:
    """The candidates ranked for the query terms `idf` (term -> weight).

    Every feature is an array over the pool and each candidate's score one element of their
    sum, added in the order the per-candidate loop this replaced added them: on 430 pools
    captured from the 100k bench store's three suites (median 114-145 rows) both gave the same
    floats, in 0.85-1.22 ms a call against 1.04-1.45 (bench/README.md, session 36)."""
    ids = pool.ids
    if not ids:
        return []
    rows = [pool.rows[fid] for fid in ids]
    at = {fid: k for k, fid in enumerate(ids)}
    terms = list(idf)
    weights = np.array([idf[t] for t in terms], dtype=float)
    column = {t: j for j, t in enumerate(terms)}
    tf = np.zeros((len(ids), len(terms)))
    for k, r in enumerate(rows):  # the counts are sparse: fill only the matches
        for t, n in r.tf.items():
            j = column.get(t)
            if j is not None:
                tf[k, j] = n
    dl = np.array([r.dl for r in rows], dtype=float)
    # A missing neighbour is index -1: the appended zero row (or -inf for borrowing).
    prev = np.array([_index(at, r.prev) for r in rows], dtype=np.int64)
    nxt = np.array([_index(at, r.next) for r in rows], dtype=np.int64)
    tf0 = np.vstack([tf, np.zeros((1, len(terms)))])
    dl0 = np.append(dl, 0.0)
    own = _bm25(tf, dl, weights, pool.avgdl)
    window = _bm25(tf + WINDOW_GAMMA * (tf0[prev] + tf0[nxt]), dl + WINDOW_GAMMA * (dl0[prev] + dl0[nxt]),
                   weights, (1 + 2 * WINDOW_GAMMA) * pool.avgdl)
    lexical = _z((1 - WINDOW_MIX) * own / (own.max() or 1.0) + WINDOW_MIX * window / (window.max() or 1.0))
    similarity = [r.similarity for r in rows]
    has_cos = np.array([c is not None for c in similarity])
    cos = np.zeros(len(ids))
    if has_cos.any():
        raw = np.array([c or 0.0 for c in similarity])
        cos[has_cos] = _z(raw[has_cos], SEMANTIC_SD_FLOOR)
    base = LEXICAL_WEIGHT * lexical + SEMANTIC_WEIGHT * cos
    base0 = np.append(base, -np.inf)
    borrowed = np.maximum(np.maximum(base0[prev], base0[nxt]), 0.0)
    asks = np.array([r.asks for r in rows], dtype=float)
    answered = np.append(asks, 0.0)[prev] * np.maximum(base0[prev], 0.0)  # no previous turn: 0 x 0
    labels = np.array([r.names_label for r in rows], dtype=float)
    says_when = np.array([r.says_when for r in rows], dtype=float)
    importance = np.array([r.importance for r in rows], dtype=float)
    activation = np.array([min(max(r.activation, 0.0), 1.0) for r in rows], dtype=float)
    recency = np.array([0.5 ** (max(r.age_days, 0.0) / RECENCY_HALF_LIFE_DAYS) for r in rows], dtype=float)
    total = base + NEIGHBOUR_WEIGHT * borrowed
    total += QA_WEIGHT * answered * (1 - asks)
    total += LABEL_WEIGHT * labels - QUESTION_WEIGHT * asks + TIME_ANSWER_WEIGHT * says_when
    total += IMPORTANCE_WEIGHT * importance + ACTIVATION_WEIGHT * activation
    total += RECENCY_WEIGHT * recency
    scores = total.tolist()
    hits = [RankedHit(fid, scores[at[fid]], set(layers)) for fid, layers in pool.candidates.items() if fid in at]
    hits.sort(key=lambda h: h.score, reverse=True)
    return hits


def feedback_weights(ranked: list[RankedHit], content_tf: dict[str, dict[str, int]], query: dict[str, float],
                     stop_lexemes: frozenset[str]) -> dict[str, float]:
    """RM3's term weights over the top hits (content terms only), for the RM3_PRESELECT
    heaviest terms that are not already in the query nor stop words."""
    weight: dict[str, float] = {}
    for hit in ranked[:RM3_FEEDBACK]:
        tf = content_tf.get(hit.id, {})
        size = sum(tf.values()) or 1
        for term, f in tf.items():
            weight[term] = weight.get(term, 0.0) + f / size * max(hit.score, 0.0)
    heaviest = sorted(weight, key=lambda t: -weight[t])
    picked = [t for t in heaviest if weight[t] > 0 and t not in query and t not in stop_lexemes and len(t) > 1]
    picked = picked[:RM3_PRESELECT]
    return {t: weight[t] for t in picked}


def expansion(weights: dict[str, float], dfs: dict[str, int], total: int) -> dict[str, float]:
    """The RM3_TERMS expansion terms with their query weights (terms in a single fragment
    carry no evidence beyond the one that has them)."""
    n = max(total, 1)
    idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in dfs.items() if df > 1 and t in weights}
    chosen = sorted(idf, key=lambda t: -weights[t] * idf[t])[:RM3_TERMS]
    if not chosen:
        return {}
    mean = sum(weights[t] for t in chosen) / len(chosen)
    if mean <= 0:
        return {}
    return {t: RM3_WEIGHT * idf[t] * weights[t] / mean for t in chosen}


def fuse_ranked_lists(layers: dict[str, list[tuple[str, float]]], weights: dict[str, float] | None = None) -> list[RankedHit]:
    """Plain RRF, for rankings without comparable scores (filter-only and case listings)."""
    weights = weights or {}
    hits: dict[str, RankedHit] = {}
    for layer, ranked in layers.items():
        weight = weights.get(layer, 1.0)
        for rank, (fragment_id, _score) in enumerate(ranked):
            hit = hits.setdefault(fragment_id, RankedHit(fragment_id, 0.0))
            hit.score += weight / (RRF_K + rank + 1)
            hit.layers.add(layer)
    return sorted(hits.values(), key=lambda h: h.score, reverse=True)
