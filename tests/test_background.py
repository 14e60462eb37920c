"""shared.background.stop ends a background task even when a library swallowed the cancel."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared import background


async def test_a_task_that_swallowed_one_cancel_is_cancelled_again_until_it_ends() -> None:
    reads = 0
    swallowed = asyncio.Event()

    async def reader() -> None:
        # As redis-py's pipeline did: the first cancel is caught and the loop reads on.
        nonlocal reads
        while True:
            try:
                reads += 1
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed.is_set():
                    raise
                swallowed.set()

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)  # into its first read
    await asyncio.wait_for(background.stop(task), timeout=30)
    assert swallowed.is_set()
    assert task.cancelled()
    assert reads == 2  # the swallowed cancel's loop started a second read, which the next cancel ended


async def test_tasks_never_started_are_skipped_and_a_failed_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("relay broke")

    failed = asyncio.create_task(fails(), name="relay")
    await asyncio.sleep(0)
    sleeping = asyncio.create_task(asyncio.sleep(3600))
    with caplog.at_level(logging.WARNING, logger="shared.background"):
        await background.stop(None, failed, sleeping)
    assert sleeping.cancelled()
    assert [r.getMessage() for r in caplog.records] == ["background task relay had failed"]
