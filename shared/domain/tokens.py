"""Token counting for budgets, with the embedding model's own (WordPiece) tokenizer."""

from __future__ import annotations

import json
from functools import lru_cache
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
        self.count = lru_cache(maxsize=CACHED_COUNTS)(self._count)

    def _count(self, text: str) -> int:
        # Minus the [CLS]/[SEP] pair the encoder adds.
        return max(len(self._tokenizer.encode(text).ids) - 2, 0)

    def count_json(self, value: Any) -> int:
        return self.count(json.dumps(value, ensure_ascii=False, default=str))
