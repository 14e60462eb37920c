"""Ranking arithmetic (services/recall/fusion.py), on hand-made pools."""

from __future__ import annotations

import pytest

from services.recall import fusion
from services.recall.fusion import Pool, PoolRow
from shared.domain import passages
from shared.domain.search import RankedHit, question_share


def _row(fid: str, tf: dict[str, int], cosine: float, prev: str | None = None, nxt: str | None = None) -> PoolRow:
    return PoolRow(fid, dict(tf), dl=10, cosine=cosine, importance=0.5, activation=0.0, age_days=1.0, prev=prev, next=nxt)


def _near_tie(term: str, first: tuple[str, float], second: tuple[str, float]) -> tuple[dict[str, PoolRow], Pool]:
    """Two lexical hits on `term` with the given cosines, and an unrelated semantic hit."""
    rows = {fid: _row(fid, {term: 1}, cosine) for fid, cosine in (first, second)}
    rows["other"] = _row("other", {}, 0.10)
    return rows, Pool({first[0]: {"L2"}, second[0]: {"L2"}, "other": {"L3"}}, rows, avgdl=10.0)


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


def test_best_passage_similarity_lifts_a_long_fragment() -> None:
    # Same words, same whole-fragment cosine; one of long's passages is much closer to the
    # query than the fragment as a whole: it ranks first, and without passages it would not.
    rows, pool = _near_tie("deploy", ("short", 0.40), ("long", 0.38))
    assert [h.id for h in fusion.score(pool, {"deploy": 1.0})][0] == "short"
    rows["long"].passage_cosine = 0.70
    assert rows["long"].similarity == pytest.approx((1 - fusion.PASSAGE_MIX) * 0.38 + fusion.PASSAGE_MIX * 0.70)
    assert [h.id for h in fusion.score(pool, {"deploy": 1.0})][0] == "long"


def test_a_query_naming_the_label_outranks_the_same_words_elsewhere() -> None:
    rows, pool = _near_tie("melani", ("said", 0.30), ("about", 0.31))
    assert [h.id for h in fusion.score(pool, {"melani": 1.0})][0] == "about"
    rows["said"].names_label = True  # "Melanie: ..." rather than "... Melanie ..."
    scored = {h.id: h.score for h in fusion.score(pool, {"melani": 1.0})}
    assert max(scored, key=scored.__getitem__) == "said"
    # bounded: a field match orders near-ties, it does not carry an unrelated fragment
    assert scored["said"] - scored["about"] < fusion.LABEL_WEIGHT


def test_passages_pair_sentences_under_the_lead_and_labels_drop_the_stamp() -> None:
    content = "[1:14 pm on 25 May, 2023] Melanie: Hi! I went camping. It was fun. The kids loved it. Bye."
    lead = "[1:14 pm on 25 May, 2023] Melanie:"
    assert passages.passages(content) == [
        f"{lead} Hi! I went camping.", f"{lead} It was fun. The kids loved it.", f"{lead} Bye.",
    ]
    assert passages.label_of(content) == "Melanie"
    assert passages.label_of("Decision: move billing to Postgres. Owner: Alice.") == "Decision"
    assert passages.label_of("No label in this one.") == ""
    assert passages.label_of("x" * 200 + ": too far in") == ""
    assert passages.label_of("Moved billing to Postgres because of the locks. Owner: Alice.") == ""
    assert passages.label_of("The team that owns the billing service: platform.") == ""  # a clause, not a name
    assert passages.passages("Moved billing. It was slow. Owner: Alice. Done.") == ["Moved billing. It was slow.", "Owner: Alice. Done."]
    # one or two sentences: the fragment is its own passage
    assert passages.passages("Decision: move billing. Owner: Alice.") == []
    assert passages.passages("One sentence only") == []
    many = passages.passages(" ".join(f"Sentence {i}." for i in range(40)))
    assert len(many) == passages.MAX_PASSAGES and many[0] == "Sentence 0. Sentence 1. Sentence 2. Sentence 3. Sentence 4."
    texts, spans = passages.embedding_inputs([("ops", content), (None, "Short one.")])
    assert texts[:2] == [f"ops: {content}", "Short one."] and spans == [(2, 3), (5, 0)]
    assert texts[2:] == passages.passages(content)


def test_question_share_weighs_question_sentences_after_the_lead() -> None:
    asked = "[1:47 pm on 18 May, 2023] Sam: Wow, that's impressive! How did you get into watercolor painting?"
    assert question_share(asked) == pytest.approx(41 / 64)
    assert question_share("[d] Evan: My friend got me into it, and I was hooked right away!") == 0.0
    # a trailing bracketed note is not what was said; the lead's colon is not a sentence
    assert question_share("[d] Sam: What made you decide to get that? [shares a photo of a tree]") == 1.0
    assert question_share("Decision: should we move to Postgres 16?") == 1.0
    assert question_share("") == 0.0


def test_a_turn_that_only_asks_yields_to_the_reply_that_answers() -> None:
    # The question turn is a little closer to the query than the reply that holds the answer.
    # Without the question penalty the asker ranks first; with it the reply does.
    rows = {
        "ask": _row("ask", {"watercolor": 1}, 0.60, nxt="reply"),
        "reply": _row("reply", {"watercolor": 1}, 0.56, prev="ask"),
        "other": _row("other", {}, 0.10),
    }
    pool = Pool({"ask": {"L2"}, "reply": {"L2"}, "other": {"L3"}}, rows, avgdl=10.0)
    idf = {"watercolor": 2.0}
    rows["ask"].asks = 0.0
    assert [h.id for h in fusion.score(pool, idf)][0] == "ask"
    rows["ask"].asks = 1.0
    assert fusion.QUESTION_WEIGHT > 0
    assert [h.id for h in fusion.score(pool, idf)][0] == "reply"


def test_a_bunched_semantic_pool_cannot_bury_the_one_lexical_match() -> None:
    # Sixty templated rows whose cosines differ by hundredths, and the one fragment holding the
    # keyword, less similar to it: a spread of 0.003 must not be worth the keyword.
    rows = {f"bulk{i}": _row(f"bulk{i}", {}, 0.40 + 0.0002 * i) for i in range(60)}
    rows["match"] = _row("match", {"okapi": 2}, 0.21)
    pool = Pool({fid: {"L2"} if fid == "match" else {"L3"} for fid in rows}, rows, avgdl=10.0)
    assert [h.id for h in fusion.score(pool, {"okapi": 7.4})][0] == "match"
