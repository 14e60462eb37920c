"""Ranking arithmetic (services/recall/fusion.py), on hand-made pools."""

from __future__ import annotations

from services.recall import fusion
from services.recall.fusion import Pool, PoolRow
from shared.domain.search import RankedHit


def _row(fid: str, tf: dict[str, int], cosine: float, prev: str | None = None, nxt: str | None = None) -> PoolRow:
    return PoolRow(fid, dict(tf), dl=10, cosine=cosine, importance=0.5, activation=0.0, age_days=1.0, prev=prev, next=nxt)


def test_a_turn_next_to_the_match_outranks_an_unrelated_one() -> None:
    # q says "deploy"; b answers it without the word. c is as close to the query as b but
    # stands alone: the window BM25 and borrowing lift b over c.
    rows = {
        "a": _row("a", {"deploy": 2}, 0.30, nxt="b"),
        "b": _row("b", {}, 0.25, prev="a", nxt="x"),
        "x": _row("x", {}, 0.10, prev="b"),
        "c": _row("c", {}, 0.25),
    }
    pool = Pool({"a": {"L2"}, "b": {"NB"}, "c": {"L3"}}, rows, avgdl=10.0)
    ranked = [h.id for h in fusion.score(pool, {"deploy": 2.0})]
    assert ranked[0] == "a"
    assert ranked.index("b") < ranked.index("c")
    assert "x" not in ranked  # pooled for context only, never a candidate


def test_feedback_skips_query_terms_stop_words_and_zero_weights() -> None:
    ranked = [RankedHit("a", 1.0), RankedHit("b", -0.5)]
    content = {"a": {"deploy": 1, "rollback": 2, "the": 3}, "b": {"canary": 5}}
    weights = fusion.feedback_weights(ranked, content, {"deploy": 1.0}, frozenset({"the"}))
    assert set(weights) == {"rollback"}  # b scored below zero: it carries no weight


def test_expansion_needs_evidence_and_weight() -> None:
    assert fusion.expansion({"rollback": 0.0}, {"rollback": 5}, 100) == {}
    assert fusion.expansion({"rollback": 0.4}, {"rollback": 1}, 100) == {}  # in one fragment only
    extra = fusion.expansion({"rollback": 0.4, "canary": 0.2}, {"rollback": 5, "canary": 50}, 100)
    assert set(extra) == {"rollback", "canary"} and extra["rollback"] > extra["canary"] > 0
