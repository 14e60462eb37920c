"""Token counting for budgets, with the embedding model's own (WordPiece) tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class TokenCounter:
    def __init__(self, tokenizer_path: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        # Minus the [CLS]/[SEP] pair the encoder adds.
        return max(len(self._tokenizer.encode(text).ids) - 2, 0)

    def count_json(self, value: Any) -> int:
        return self.count(json.dumps(value, ensure_ascii=False, default=str))
