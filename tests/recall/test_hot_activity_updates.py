"""Recall's side effects (access count, last access, activation) update the rows it returns in
place: every fragments page keeps room for one more version of its rows (migration 0029), so
the update is HOT, on the same page, and no index gets a new entry. At fillfactor 80 two rows
of ~3 KB (then any row: both vectors inline; now a long turn) filled a page, and every update went into all
the table's indexes, its HNSW graphs included (132-164 ms for 20 rows at 1M).

The room is for one version: the next update finds it again once the page is pruned, which
needs every older snapshot gone. So the first update is what is checked, on a stack of its
own without beat: on the shared stack another update (a maintenance cycle) can take the room."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from shared.db import SEARCH_PATH
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique, wait_for

SUBJECTS = ["billing", "search", "checkout", "inventory", "payments", "catalog", "shipping", "returns"]


def _turn(subject: str) -> str:
    """A long episode (stored whole), different for every subject, whose row is ~3 KB: since
    migration 0034 a short fragment's row is ~1.9 KB (one half vector), which leaves room for a
    version at fillfactor 80 too, so the rows are padded to the width where 0029's reserve is
    what keeps the room."""
    return f"The {subject} runbook lists the dashboards to check first. " + "Read the alerts before paging anyone. " * 31


@pytest.fixture(scope="module")
async def quiet(stack_dir: Path) -> AsyncIterator[Stack]:
    async with running(new_stack_config(stack_dir / "hot-updates", beat=False)) as own:
        yield own


@pytest.fixture
async def db(quiet: Stack):  # type: ignore[no-untyped-def]
    conn = await asyncpg.connect(quiet.database_url, server_settings={"search_path": SEARCH_PATH})
    yield conn
    await conn.close()


async def _rows(db: asyncpg.Connection, ids: list[str]) -> dict[str, asyncpg.Record]:
    rows = await db.fetch(
        "SELECT id, (ctid::text::point)[0]::bigint AS page, access_count, pg_column_size(f.*) AS size"
        " FROM fragments f WHERE id = ANY($1::text[])", ids,
    )
    return {r["id"]: r for r in rows}


async def test_recall_access_updates_stay_on_their_page(quiet: Stack, db: asyncpg.Connection) -> None:
    key, _ = await create_api_key(quiet.database_url)
    ws = unique()
    async with mcp_session(quiet.mcp_url, key) as s:
        stored = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": _turn(subject), "topic": "operations", "type": "episode"} for subject in SUBJECTS]})
        ids = [r["id"] for r in stored["results"]]
        assert len(ids) == len(SUBJECTS)
        before = await _rows(db, ids)
        # Two rows of this width share a page at fillfactor 80 and leave it no room for a version.
        assert all(2720 < r["size"] <= 3260 for r in before.values())
        found = await call(s, "recall", {"keywords": ["runbook"], "workspace": ws, "pageSize": len(SUBJECTS), "tokenBudget": 8000})
        assert {f["id"] for f in found["fragments"]} == set(ids)
    # The side effects land after the reply.
    assert await wait_for(lambda: db.fetchval("SELECT bool_and(access_count >= 1) FROM fragments WHERE id = ANY($1::text[])", ids))
    after = await _rows(db, ids)
    assert all(r["access_count"] >= 1 for r in after.values())
    moved = {fid: (before[fid]["page"], r["page"]) for fid, r in after.items() if r["page"] != before[fid]["page"]}
    assert moved == {}
