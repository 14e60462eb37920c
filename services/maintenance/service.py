"""Maintenance jobs as plain async functions over a pool; the Celery tasks are thin."""

from __future__ import annotations

import asyncpg

from shared.repositories import links as links_repo

# 500 fragments per sweep: one LATERAL kNN query each (~2 ms with HNSW), ~1 s of work.
LINK_SWEEP_BATCH = 500


async def link_new_fragments(pool: asyncpg.Pool, fragment_ids: list[str]) -> int:
    async with pool.acquire() as conn, conn.transaction():
        return await links_repo.auto_link(conn, fragment_ids)


async def link_sweep(pool: asyncpg.Pool) -> int:
    """Fragments whose post-commit link job was never delivered get linked here."""
    async with pool.acquire() as conn:
        ids = await links_repo.unlinked_fragment_ids(conn, LINK_SWEEP_BATCH)
    if not ids:
        return 0
    return await link_new_fragments(pool, ids)
