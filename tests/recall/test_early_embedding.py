"""When the query's embedding starts (services/recall/search.py, dense_stop_possible). In a
scope where a word can be in DENSE_STOP_SHARE of the fragments, what the vector layer embeds
depends on the document frequencies, so the model waits for them; in a scope where none can
(larger than DF_CAP / DENSE_STOP_SHARE, or under DENSE_STOP_MIN_SCOPE) the question is embedded
as it is, and the model runs from the start, beside the document-frequency lookup (at 1M
fragments that lookup is 2-9 ms of the filtered path's p50, bench/README)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.recall import search
from services.recall.search import DocumentFrequencies
from shared.domain.principal import Principal
from shared.embeddings import load_embedder
from shared.repositories import retrieval
from tests.recall.layered import search_workspace
from tests.support import Stack, call, create_api_key, mcp_session, unique

TURNS = [
    "The nightly backup of the orders database runs at 02:00 UTC.",
    "Restoring the orders database from a backup takes about forty minutes.",
    "The design review for the checkout page is on Thursday.",
]
QUESTION = "How long does a restore of the orders database take?"


class Recorded(DocumentFrequencies):
    """Document frequencies that note when their lookup began and ended."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def lookup(self, conn, principal, corpus, terms):  # type: ignore[no-untyped-def]
        self.events.append("df:start")
        await asyncio.sleep(0.05)  # a lookup long enough that an embedding begun with it begins inside it
        try:
            return await super().lookup(conn, principal, corpus, terms)
        finally:
            self.events.append("df:end")


@pytest.fixture
async def scene(stack: Stack) -> tuple[Principal, str, dict[str, str]]:
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, key) as s:
        ids = {t: (await call(s, "remember", {"content": t, "topic": "ops", "type": "fact", "workspace": ws}))["id"] for t in TURNS}
    return Principal(key_id=key_id, visible_key_ids=(key_id,)), ws, ids


async def _search(stack: Stack, scene: tuple[Principal, str, dict[str, str]], scope_total: int, with_pool: bool) -> tuple[list[str], list[str], list[str]]:
    principal, ws, _ = scene
    embedder = load_embedder()
    events: list[str] = []
    embedded: list[list[str]] = []

    async def embed(texts: list[str]) -> list[np.ndarray]:
        events.append("embed")
        embedded.append(texts)
        return list(await asyncio.to_thread(embedder.embed, texts))

    outcome = await search_workspace(stack, principal, ws, QUESTION, embed, scope_total, Recorded(events), with_pool)
    assert any(step.startswith("L3:") for step in outcome.path), outcome.path  # the vector layer ran
    return events, [h.id for h in outcome.hits], [t for batch in embedded for t in batch]


@pytest.mark.parametrize(("scope_total", "with_pool"), [
    (int(retrieval.DF_CAP / search.DENSE_STOP_SHARE) + 1, True),  # no count reaches half of it
    (int(retrieval.DF_CAP / search.DENSE_STOP_SHARE) + 1, False),
    (len(TURNS), True),  # under DENSE_STOP_MIN_SCOPE: a share of three says nothing
])
async def test_a_scope_no_word_can_fill_embeds_from_the_start(stack: Stack, scene, scope_total: int, with_pool: bool) -> None:  # type: ignore[no-untyped-def]
    events, hits, embedded = await _search(stack, scene, scope_total, with_pool)
    assert events.index("embed") < events.index("df:end"), events
    assert embedded == [QUESTION]  # the question as it is, once
    assert hits[0] == scene[2][TURNS[1]]


async def test_a_scope_a_word_can_fill_embeds_after_the_frequencies(stack: Stack, scene) -> None:  # type: ignore[no-untyped-def]
    """The scope given as DENSE_STOP_MIN_SCOPE fragments (three are stored): a word in half of
    them could go, and which words go is known only from the frequencies."""
    events, hits, embedded = await _search(stack, scene, search.DENSE_STOP_MIN_SCOPE, with_pool=True)
    assert events.index("df:end") < events.index("embed"), events
    assert QUESTION in embedded
    assert hits[0] == scene[2][TURNS[1]]
