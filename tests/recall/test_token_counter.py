"""Token budgets are counted with the model's WordPiece tokenizer; the count cache must never
change a count, and stays bounded."""

from __future__ import annotations

from tokenizers import Tokenizer

from shared.domain import tokens as tokens_mod
from shared.domain.tokens import TokenCounter
from shared.embeddings import model_dir

TEXTS = [
    "Postgres connection pool is sized 20 per replica.",
    "서버가 재시작되면 캐시를 비운다",
    "",
    '{"id": "frag-1", "content": "deploy with make run"}',
]


def _reference(text: str) -> int:
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return len(tokenizer.encode(text).ids) - 2


def test_counts_match_the_tokenizer_cached_or_not() -> None:
    counter = TokenCounter(model_dir() / "tokenizer.json")
    expected = [_reference(t) for t in TEXTS]
    assert [counter.count(t) for t in TEXTS] == expected
    # Again (all cached), mixed with duplicates and a new text.
    again = [counter.count(t) for t in (TEXTS[1], TEXTS[0], TEXTS[1], "one more")]
    assert again == [expected[1], expected[0], expected[1], _reference("one more")]
    assert counter.count_json({"a": "b"}) == _reference('{"a": "b"}')
    assert expected[0] > 5 and expected[1] > 3


def test_the_cache_is_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(tokens_mod, "CACHED_COUNTS", 3)
    counter = TokenCounter(model_dir() / "tokenizer.json")
    texts = [f"text number {i}" for i in range(10)]
    assert [counter.count(t) for t in texts] == [_reference(t) for t in texts]
    assert counter.count.cache_info().currsize == 3
    assert counter.count(texts[0]) == _reference(texts[0])  # evicted, counted afresh


def test_json_counted_piecewise_equals_the_whole() -> None:
    """count_json sums the pieces of a value; that must equal the tokenizer's count of the
    whole serialisation for everything recall renders: nested fields, lists, numbers, nulls,
    dates, Korean, CJK, emoji, quotes and backslashes inside strings, long words."""
    import json
    import random
    from datetime import datetime, timezone

    counter = TokenCounter(model_dir() / "tokenizer.json")
    rng = random.Random(7)
    words = ["deploy", "서버가", "재시작", "日本語", "🙂", 'say "hi"', "C:\\tmp\\x", "x" * 130, "naïve café",
             "3.14159", "-7", "a,b:c", "{braces}", "[list]", "OOMKilled", "ab-cd_ef", "", " spaced  out "]

    def value(depth: int) -> object:
        kind = rng.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return " ".join(rng.choice(words) for _ in range(rng.randrange(0, 12)))
        if kind == 1:
            return rng.choice([0, 1, -3, 0.5, 0.123456789, 1e-9, 12345678901234])
        if kind == 2:
            return rng.choice([None, True, False])
        if kind == 3:
            return datetime(2026, 12, 1, 4, 5, 6, 789, tzinfo=timezone.utc)
        if kind == 4:
            return rng.choice(words)
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randrange(0, 4))]
        return {rng.choice(words) or "k": value(depth + 1) for _ in range(rng.randrange(0, 5))}

    for _ in range(300):
        item = {"id": f"frag-{rng.randrange(10**6)}", "content": value(2), "extra": value(0), "score": rng.random()}
        whole = json.dumps(item, ensure_ascii=False, default=str)
        assert counter.count_json(item) == _reference(whole), whole
