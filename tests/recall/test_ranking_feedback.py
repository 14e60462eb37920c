"""How much a question's own words count against what ranking adds to them (services/recall/fusion.py):
pseudo-relevance feedback terms and the penalty for turns that only ask."""

from __future__ import annotations

from services.recall import fusion
from services.recall.fusion import Pool, PoolRow


def _row(fid: str, tf: dict[str, int], cosine: float, prev: str | None = None, nxt: str | None = None) -> PoolRow:
    return PoolRow(fid, dict(tf), dl=12, cosine=cosine, importance=0.5, activation=0.0, age_days=1.0, prev=prev, next=nxt)


def _fillers(n: int) -> dict[str, PoolRow]:
    """Unrelated pooled fragments, so that z-scores have a population."""
    return {f"f{k}": _row(f"f{k}", {}, 0.05 + 0.01 * k) for k in range(n)}


def test_feedback_terms_do_not_outweigh_the_question_own_word() -> None:
    # "yoga" is the question's word. The feedback terms come from the top hits' other words
    # (a session's date, the other speaker's name, small talk); a fragment holding all of
    # them and not the question's word stays below the one that holds it.
    idf = {"yoga": 2.5}
    weights = {"march": 0.5, "john": 0.4, "great": 0.3, "aerial": 0.2}
    dfs = {"march": 40, "john": 300, "great": 120, "aerial": 3}
    extra = fusion.expansion(weights, dfs, 600)
    assert set(extra) == set(weights)
    rows = {
        "own": _row("own", {"yoga": 1}, 0.35),
        "drift": _row("drift", dict.fromkeys(weights, 1), 0.35),
        **_fillers(8),
    }
    pool = Pool({fid: {"L2"} for fid in rows}, rows, avgdl=12.0)
    ranked = [h.id for h in fusion.score(pool, {**idf, **extra})]
    assert ranked.index("own") < ranked.index("drift")
    # Feedback still counts: with the question's word on both, the one with feedback terms is first.
    rows["drift"].tf["yoga"] = 1
    assert next(h.id for h in fusion.score(pool, {**idf, **extra})) == "drift"


def test_a_turn_that_asks_in_the_question_words_yields_to_the_reply() -> None:
    # The asker repeats more of the question's words and is closer to it in meaning than the
    # reply that holds the answer; the reply still ranks first, and the asker stays in the page.
    rows = {
        "ask": _row("ask", {"watercolor": 1, "paint": 1}, 0.62, nxt="reply"),
        "reply": _row("reply", {"watercolor": 1}, 0.52, prev="ask"),
        **_fillers(8),
    }
    pool = Pool({fid: {"L2"} for fid in rows}, rows, avgdl=12.0)
    idf = {"watercolor": 2.0, "paint": 1.5}
    rows["ask"].asks = 1.0
    ranked = [h.id for h in fusion.score(pool, idf)]
    assert ranked[0] == "reply"
    assert ranked.index("ask") < 3
    # A statement with the same words and closeness is not penalised: it ranks first.
    rows["ask"].asks = 0.0
    assert next(h.id for h in fusion.score(pool, idf)) == "ask"
