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
    real_turn_neighbours = retrieval.turn_neighbours

    async def turn_neighbours(conn: Any, principal: Principal, flt: FragmentFilter, ids: list[str], width: int = 2) -> Any:
        looked_up.append(list(ids))
        return await real_turn_neighbours(conn, principal, flt, ids, width)

    monkeypatch.setattr(retrieval, "turn_neighbours", turn_neighbours)
    whole = await _search(stack, principal, ws, read_ahead=False)
    assert len(looked_up) == 1, looked_up  # without a second connection, one lookup after fusion
    looked_up.clear()
    ahead = await _search(stack, principal, ws, read_ahead=True)
    assert len(looked_up) == 2 and looked_up[0], looked_up  # the lexical candidates' first, then the rest
    assert not set(looked_up[0]) & set(looked_up[1])  # no id is looked up twice

    assert [h.id for h in ahead.hits] == [h.id for h in whole.hits]
    assert [h.score for h in ahead.hits] == pytest.approx([h.score for h in whole.hits], rel=1e-6)
    assert ahead.path == whole.path
    assert len(whole.hits) == len(TURNS)  # every turn pooled (as a candidate or a neighbour)
