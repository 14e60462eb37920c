"""The lexical layer's impact-ordered path (migration 0023): a lone candidate term with a long
posting list is read best postings first, per tf value, instead of whole. It must find what
scoring the whole list finds, in the same order, and only in the caller's scope."""

from __future__ import annotations

import asyncpg
import pytest

from shared.db import SEARCH_PATH
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.repositories import retrieval
from tests.support import Stack, call, create_api_key, mcp_session, unique


@pytest.fixture
async def conn(stack: Stack):  # type: ignore[no-untyped-def]
    c = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    yield c
    await c.close()


# tf of the postings read one tf value at a time in these tests (a stored word is also one of
# the fragment's keywords, so its tf starts at 2).
TAIL_FROM = 3


FILLER = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
          "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]


def _texts(term: str) -> list[str]:
    """One word in fragments of every tf and length: the best are short and repeat it."""
    filler = FILLER
    texts = [
        f"{term} {term} {term} pager storm.",
        f"The {term} pager fired, then {term} again.",
        f"{term} {term} {term} {term} during the {' '.join(filler[:9])} rehearsal window.",
    ]
    # tf 1, one more distinct word each time (no two alike in length, so no ties in score)
    texts += [f"The {term} note mentions {' '.join(filler[:n])}." for n in range(1, 13)]
    return texts


def _impact_path(monkeypatch: pytest.MonkeyPatch, pre_rank: int) -> list[str]:
    """Any term with more than one posting takes the impact path; each tf read stops after
    `pre_rank`; tf above TAIL_FROM goes through the tail read. Returns the terms it read."""
    read: list[str] = []
    impact_postings = retrieval._impact_postings

    def spy(scope: str, term: str, idf: str, rank: str) -> tuple[str, str]:
        read.append(term)
        return impact_postings(scope, term, idf, rank)

    monkeypatch.setattr(retrieval, "_impact_postings", spy)
    monkeypatch.setattr(retrieval, "MATCH_BUDGET", 1)
    monkeypatch.setattr(retrieval, "PRE_RANK", pre_rank)
    monkeypatch.setattr(retrieval, "IMPACT_TF_STREAMS", TAIL_FROM)
    return read


async def _ranked(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, term: str, limit: int = 60
) -> list[tuple[str, float]]:
    dfs = await retrieval.document_frequencies(conn, principal, FragmentFilter(workspace=flt.workspace), [term])
    stats = retrieval.term_stats(dfs, 1000)
    found, _ = await retrieval.bm25_candidates(conn, principal, flt, stats, dfs, limit)
    return found


async def test_a_long_posting_list_read_in_impact_order_finds_the_same_best(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    term = f"quorvex{unique().replace('-', '')[-8:]}"
    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": t, "topic": "ops", "type": "fact"} for t in _texts(term)]})
    ids = [r["id"] for r in reply["results"]]
    tfs = dict(await conn.fetch("SELECT fragment_id, tf FROM fragment_terms WHERE term = $1", term))
    assert set(tfs) == set(ids) and max(tfs.values()) > TAIL_FROM >= min(tfs.values())  # both reads are exercised

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    flt = FragmentFilter(workspace=ws)
    whole = await _ranked(conn, principal, flt, term)  # 15 postings: within MATCH_BUDGET, scored whole
    assert len(whole) == len(ids)
    for pre_rank in (1, 3, 6):
        with monkeypatch.context() as m:
            read = _impact_path(m, pre_rank)
            impact = await _ranked(conn, principal, flt, term)
        assert len(read) == 1
        assert [i for i, _ in impact] == [i for i, _ in whole[:pre_rank]]
        assert [round(s, 9) for _, s in impact] == [round(s, 9) for _, s in whole[:pre_rank]]
    # The best is the short fragment that repeats the word, not the longer one repeating it more.
    assert whole[0][0] == ids[0]


async def test_the_impact_path_keeps_tenant_workspace_and_type_scope(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Better postings of the same word elsewhere (another tenant, another workspace, another
    type) never fill the bounded reads of the caller's scope; global fragments do."""
    term = f"vantrelle{unique().replace('-', '')[-8:]}"
    key, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    ws, elsewhere = unique(), unique()
    best = f"{term} {term} {term}."
    async with mcp_session(stack.mcp_url, key) as s:
        mine = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"The {term} runbook covers {' '.join(FILLER[:n])}.", "topic": "ops", "type": "fact"}
            for n in range(1, 6)]})
        glob = await call(s, "remember", {"content": f"Every team reads the {term} notes first.", "topic": "ops", "type": "fact"})
        away = await call(s, "remember", {"content": best, "topic": "ops", "type": "fact", "workspace": elsewhere})
        decision = await call(s, "remember", {"content": f"{term} {term}, decided.", "topic": "ops", "type": "decision", "workspace": ws})
    async with mcp_session(stack.mcp_url, other) as s:
        foreign = await call(s, "remember", {"content": best, "topic": "ops", "type": "fact", "workspace": ws})

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    facts = FragmentFilter(workspace=ws, types=("fact",))
    allowed = {r["id"] for r in mine["results"]} | {glob["id"]}
    with monkeypatch.context() as m:
        read = _impact_path(m, 3)
        impact = await _ranked(conn, principal, facts, term)
        everywhere = await _ranked(conn, principal, FragmentFilter(), term)
    assert len(read) == 2
    assert len(impact) == 3 and {i for i, _ in impact} <= allowed
    assert [i for i, _ in impact] == [i for i, _ in (await _ranked(conn, principal, facts, term))[:3]]
    # Unscoped, the caller's own best postings come first: its other workspace and the decision.
    assert {i for i, _ in everywhere[:2]} == {away["id"], decision["id"]}
    assert foreign["id"] not in {i for i, _ in everywhere}


async def test_the_impact_index_is_added_beside_the_lookup_index(conn: asyncpg.Connection) -> None:
    """Additive: code that reads the postings through fragment_terms_lookup (document
    frequencies, short lists, older releases on a migrated store) finds it unchanged."""
    indexes = dict(await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'agent_memory' AND tablename = 'fragment_terms'"))
    assert "(term, key_id, workspace, type) INCLUDE (fragment_id, tf, dl)" in indexes["fragment_terms_lookup"]
    assert "(term, tf, dl, key_id, workspace, type) INCLUDE (fragment_id)" in indexes["fragment_terms_impact"]
