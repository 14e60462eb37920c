"""A reply borrows from the question it answers (services/recall/fusion.py, QA_WEIGHT): in a
chat the turn asking "How did the deploy go?" holds the query's words, the reply after it the
answer; a turn after a statement with the same words gains nothing more than window BM25 and
neighbour borrowing already give it."""

from __future__ import annotations

from services.recall import fusion
from services.recall.fusion import Pool, PoolRow


def _row(fid: str, tf: dict[str, int], cosine: float, asks: float = 0.0, prev: str | None = None, nxt: str | None = None) -> PoolRow:
    return PoolRow(fid, dict(tf), dl=10, cosine=cosine, importance=0.5, activation=0.0, age_days=1.0, prev=prev, next=nxt, asks=asks)


def _scores() -> dict[str, float]:
    # q asks about the deploy, r replies; s states the same words, t follows it. r and t are
    # otherwise alike (same cosine, no query word, a neighbour with the same base score);
    # u is a reply that itself only asks back.
    rows = {
        "q": _row("q", {"deploy": 2}, 0.30, asks=1.0, nxt="r"),
        "r": _row("r", {}, 0.25, prev="q"),
        "s": _row("s", {"deploy": 2}, 0.30, nxt="t"),
        "t": _row("t", {}, 0.25, prev="s"),
        "p": _row("p", {"deploy": 2}, 0.30, asks=1.0, nxt="u"),
        "u": _row("u", {}, 0.25, asks=1.0, prev="p"),
        "z": _row("z", {}, 0.05),
    }
    pool = Pool({fid: {"L3"} for fid in rows}, rows, avgdl=10.0)
    return {h.id: h.score for h in fusion.score(pool, {"deploy": 2.0})}


def test_the_reply_to_a_question_outranks_the_turn_after_a_statement() -> None:
    scores = _scores()
    assert scores["r"] > scores["t"] + 0.05, scores


def test_a_reply_that_only_asks_back_borrows_nothing_from_the_question() -> None:
    scores = _scores()
    # u loses QUESTION_WEIGHT for asking; beyond that it is scored as t (no QA borrowing).
    assert abs(scores["u"] + fusion.QUESTION_WEIGHT - scores["t"]) < 1e-9, scores
