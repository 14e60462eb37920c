"""Token counting for budgets, with the embedding model's own (WordPiece) tokenizer."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# Counts of recently rendered values: the same fragments come back query after query, and
# WordPiece costs ~0.17 ms per rendered fragment (~470 characters of JSON): counted whole,
# ten of them were ~2 ms of a recall's 22.
CACHED_COUNTS = 8192


class TokenCounter:
    def __init__(self, tokenizer_path: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.count = lru_cache(maxsize=CACHED_COUNTS)(self._count)

    def _count(self, text: str) -> int:
        # Minus the [CLS]/[SEP] pair the encoder adds.
        return max(len(self._tokenizer.encode(text).ids) - 2, 0)

    def count_json(self, value: Any) -> int:
        """Tokens of `json.dumps(value)`, counted piece by piece: BERT's pre-tokenizer splits
        at every punctuation character, so JSON's braces, brackets, colons, commas and quotes
        are tokens of their own and no word spans two pieces. The sum over the pieces is the
        count of the whole, and each piece (a fragment's content, a field name) is counted
        once and then cached, while the few that change per query (scores) are short."""
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            if not value:
                return 2
            # { } and a comma between items; per item the key, the colon and the value.
            return 2 + len(value) - 1 + sum(
                self.count(json.dumps(k, ensure_ascii=False)) + 1 + self.count_json(v) for k, v in value.items()
            )
        if isinstance(value, (list, tuple)):
            if not value:
                return 2
            return 2 + len(value) - 1 + sum(self.count_json(v) for v in value)
        return self.count(json.dumps(value, ensure_ascii=False, default=str))
