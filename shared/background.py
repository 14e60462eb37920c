"""Stopping a process's background tasks (relays, readers, flushers) at shutdown."""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)

# How long a cancelled task gets to end before it is cancelled again.
RECANCEL_SECONDS = 0.5


async def stop(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel the tasks (None: a task that was never started) and return once every one has
    ended. The cancel is repeated while a task runs on, because a library can swallow one:
    redis-py's pipeline returned normally from a cancelled XINFO, the gateway's event hub
    went on to its next XREAD, and a gateway whose port was taken logged "address already in
    use" but never exited, so its supervisor never started it again. A task that ended with
    an error rather than the cancel is logged; stopping goes on."""
    running = {task for task in tasks if task is not None}
    while running:
        for task in running:
            task.cancel()
        done, running = await asyncio.wait(running, timeout=RECANCEL_SECONDS)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                logger.warning("background task %s had failed", task.get_name(), exc_info=task.exception())
