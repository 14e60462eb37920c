"""While the vector layer still runs on its own connection, recall reads the lexical layer's
candidates' neighbouring turns and pool rows (services/recall/search.py, _read_ahead); after it,
only the rest are read. The ranking is the one that the lookups made in one piece give."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from services.recall import search
from services.recall.search import DocumentFrequencies, SearchOutcome
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.embeddings import load_embedder
from shared.repositories import retrieval
from tests.recall.layered import search_workspace
from tests.support import Stack, call, create_api_key, mcp_session, unique

TURNS = [
    "Morning! Did the orders database restore finish overnight?",
    "It did, the restore took about forty minutes in the end.",
    "Good. Was anything lost between the backup and the restore?",
    "Only the last six minutes of writes; we replayed them from the queue.",
    "Then let's write that down in the runbook for the next time.",
    "Unrelated: the design review for the checkout page moved to Thursday.",
    "Thanks, I'll tell the frontend team about Thursday.",
    "Also the on-call rotation changes next week, Priya takes Monday.",
]
QUESTION = "How long did the orders database restore take?"


@pytest.fixture
async def conversation(stack: Stack) -> tuple[Principal, str]:
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, key) as s:  # one session: the turns are neighbours
        for turn in TURNS:
            await call(s, "remember", {"content": turn, "topic": "standup", "type": "episode", "workspace": ws})
    return Principal(key_id=key_id, visible_key_ids=(key_id,)), ws


async def _search(stack: Stack, principal: Principal, ws: str, read_ahead: bool) -> SearchOutcome:
    embedder = load_embedder()

    async def embed(texts: list[str]) -> list[np.ndarray]:
        if read_ahead:
            await asyncio.sleep(0.3)  # the vector layer is still running when BM25 has answered
        return list(await asyncio.to_thread(embedder.embed, texts))

    # a scope no word can fill: the question is embedded from the start
    scope_total = int(retrieval.DF_CAP / search.DENSE_STOP_SHARE) + 1
    return await search_workspace(stack, principal, ws, QUESTION, embed, scope_total, DocumentFrequencies(), with_pool=read_ahead)


async def test_reading_ahead_ranks_as_the_lookups_in_one_piece(
    stack: Stack, conversation: tuple[Principal, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    principal, ws = conversation
    looked_up: list[list[str]] = []
    turns_on: list[Any] = []  # the connection of each turn_neighbours lookup
    graph_on: list[Any] = []
    rows_of: list[list[str]] = []
    real_turn_neighbours, real_graph_neighbours, real_pool_rows = retrieval.turn_neighbours, retrieval.graph_neighbours, retrieval.pool_rows

    async def turn_neighbours(conn: Any, principal: Principal, flt: FragmentFilter, ids: list[str], width: int = 2) -> Any:
        looked_up.append(list(ids))
        turns_on.append(conn)
        return await real_turn_neighbours(conn, principal, flt, ids, width)

    async def graph_neighbours(conn: Any, *args: Any) -> Any:
        graph_on.append(conn)
        return await real_graph_neighbours(conn, *args)

    async def pool_rows(conn: Any, principal: Principal, ids: list[str], *args: Any) -> Any:
        rows_of.append(list(ids))
        return await real_pool_rows(conn, principal, ids, *args)

    monkeypatch.setattr(retrieval, "turn_neighbours", turn_neighbours)
    monkeypatch.setattr(retrieval, "graph_neighbours", graph_neighbours)
    monkeypatch.setattr(retrieval, "pool_rows", pool_rows)
    whole = await _search(stack, principal, ws, read_ahead=False)
    assert len(looked_up) == 1, looked_up  # without a second connection, one lookup after fusion
    assert turns_on == graph_on
    looked_up.clear()
    turns_on.clear()
    graph_on.clear()
    rows_of.clear()
    ahead = await _search(stack, principal, ws, read_ahead=True)
    assert len(looked_up) == 2 and looked_up[0], looked_up  # the lexical candidates' first, then the rest
    assert not set(looked_up[0]) & set(looked_up[1])  # no id is looked up twice
    # After the vector layer the best candidates' turns are read on a lent connection while
    # the search's own reads the graph's edges, then the vector layer's pool rows.
    assert len(graph_on) == 1 and turns_on[1] is not graph_on[0], (turns_on, graph_on)
    assert len(rows_of) == 3 and rows_of[0], rows_of  # the read-ahead's, the vector layer's, the rest
    assert sum(len(ids) for ids in rows_of) == len({fid for ids in rows_of for fid in ids})  # none read twice

    assert [h.id for h in ahead.hits] == [h.id for h in whole.hits]
    assert [h.score for h in ahead.hits] == pytest.approx([h.score for h in whole.hits], rel=1e-6)
    assert ahead.path == whole.path
    assert len(whole.hits) == len(TURNS)  # every turn pooled (as a candidate or a neighbour)
