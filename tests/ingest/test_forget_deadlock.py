"""forget by topic is run again when Postgres breaks a deadlock by aborting it: the worker's link
job and other writers lock the same fragments in their own order (a clean-clone run once got an
ingest HTTP 500 from forget beside the link jobs of the fragments it deleted)."""

from __future__ import annotations

import asyncio

from tests.ingest.helpers import db
from tests.support import call, create_api_key, mcp_session, unique

ROWS = 6


async def _waiting_on_a_lock(conn, other_pid: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> $1 AND query ILIKE 'DELETE FROM fragments%'",
        other_pid,
    ))


async def test_forget_by_topic_survives_a_deadlock(stack) -> None:  # type: ignore[no-untyped-def]
    key, _ = await create_api_key(stack.database_url)
    ws, topic = unique(), unique("deadlock")
    async with mcp_session(stack.mcp_url, key) as s:
        for i in range(ROWS):
            await call(s, "remember", {"content": f"Scratch note {i} on the {topic} rollout.", "topic": topic, "type": "fact", "workspace": ws})
        async with db(stack.database_url) as other, db(stack.database_url) as watch:
            ids = [r["id"] for r in await other.fetch("SELECT id FROM fragments WHERE topic = $1 ORDER BY ctid", topic)]
            assert len(ids) == ROWS
            pid = await other.fetchval("SELECT pg_backend_pid()")
            tx = other.transaction()
            await tx.start()
            # Another writer holds the fragment forget's DELETE reaches last (heap order)...
            await other.execute("SELECT 1 FROM fragments WHERE id = $1 FOR UPDATE", ids[-1])
            forgetting = asyncio.ensure_future(call(s, "forget", {"topic": topic}))
            for _ in range(300):
                if await _waiting_on_a_lock(watch, pid):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("forget never waited on the other writer's lock")
            # ...and forget holds the ones before it: they are locked, so SKIP LOCKED passes them.
            free = {r["id"] for r in await watch.fetch("SELECT id FROM fragments WHERE id = ANY($1) FOR UPDATE SKIP LOCKED", ids[:-1])}
            held = [fid for fid in ids[:-1] if fid not in free]
            assert held, "forget holds none of the rows: no deadlock can form"
            # The other writer now wants one of them: a cycle. Postgres aborts forget's transaction
            # (it waited first), and this lock is granted.
            await other.execute("SELECT 1 FROM fragments WHERE id = $1 FOR UPDATE", held[0])
            await tx.commit()
            result = await forgetting
    assert result == {"success": True, "deleted": ROWS}
    async with db(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM fragments WHERE topic = $1", topic) == 0
