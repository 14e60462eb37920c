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
