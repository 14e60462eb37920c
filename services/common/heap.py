"""Start-up heap settling for the long-running services."""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Once start-up has loaded everything (modules, model, tokenizer, analysers): collect,
    then move every survivor into the permanent generation so the cyclic collector stops
    re-scanning them. Measured in the recall service under LoCoMo queries: each full (gen 2)
    collection took ~75 ms, about once per hundred recalls, one p99 outlier each; frozen, they
    take under 1 ms. Objects made after this are collected as usual."""
    gc.collect()
    gc.freeze()
