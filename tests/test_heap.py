"""The services settle their start-up heap: survivors move to the permanent generation."""

from __future__ import annotations

import gc

from services.common.heap import settle_heap


def test_settle_heap_freezes_the_survivors_and_keeps_collecting_new_garbage() -> None:
    try:
        settle_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # this test process's modules, at least
        cycle: list[object] = []
        cycle.append(cycle)  # garbage made after the freeze is still collected
        del cycle
        assert gc.collect() >= 1
        # A collection leaves the frozen generation frozen (an unfreeze would move it all back).
        # Not `== frozen`: frozen objects still die by refcount, and the stack's watchdog
        # threads in this process may drop a few meanwhile.
        assert gc.get_freeze_count() > frozen * 0.99
    finally:
        gc.unfreeze()
