"""Token counting for budgets, with the embedding model's own (WordPiece) tokenizer."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# Counts of recently rendered texts: the same fragments come back query after query, and
# WordPiece costs ~0.1 ms per fragment-sized text (a tenth of a page's recall time).
CACHED_COUNTS = 4096


class TokenCounter:
    def __init__(self, tokenizer_path: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._counts: OrderedDict[str, int] = OrderedDict()

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of `texts`; the ones not seen lately are encoded in one batch."""
        counts = [self._counts.get(t) for t in texts]
        missing = list(dict.fromkeys(t for t, n in zip(texts, counts) if n is None))
        if missing:
            # Minus the [CLS]/[SEP] pair the encoder adds.
            fresh = {t: max(len(e.ids) - 2, 0) for t, e in zip(missing, self._tokenizer.encode_batch_fast(missing))}
            for text, n in fresh.items():
                self._counts[text] = n
            while len(self._counts) > CACHED_COUNTS:
                self._counts.popitem(last=False)
            counts = [fresh[t] if n is None else n for t, n in zip(texts, counts)]
        for text in texts:
            if text in self._counts:
                self._counts.move_to_end(text)
        return counts  # type: ignore[return-value]

    def count_json(self, value: Any) -> int:
        return self.count(_json(value))

    def count_json_many(self, values: list[Any]) -> list[int]:
        return self.count_many([_json(v) for v in values])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
