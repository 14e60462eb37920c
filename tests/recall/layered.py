"""layered_search run straight against a test stack's Postgres, with a pool of its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

from services.recall.search import DocumentFrequencies, SearchOutcome, SearchRequest, layered_search
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from tests.support import Stack


async def search_workspace(
    stack: Stack, principal: Principal, ws: str, question: str, embed: Callable[[list[str]], Awaitable[list[np.ndarray]]],
    scope_total: int, df_cache: DocumentFrequencies, with_pool: bool,
) -> SearchOutcome:
    """`question` in the workspace; with_pool lends layered_search a second connection."""
    pool = await create_pool(stack.database_url, min_size=1, max_size=2, server_settings={"hnsw.iterative_scan": "relaxed_order"})
    try:
        async with pool.acquire() as conn:
            return await layered_search(
                conn, principal, FragmentFilter(workspace=ws),
                SearchRequest(text=question, keywords=[], vector=None, semantic_label="L3", threshold=None, filter_only=False, embed=embed),
                scope_total, df_cache, pool=pool if with_pool else None,
            )
    finally:
        await pool.close()
