"""The retrieval layers' SQL against the real store: postings scoped to the workspace plus
global, passages, and the fusion features the layered search reads (L3's two plans are
tests/recall/test_filtered_vector.py)."""

from __future__ import annotations

from collections.abc import Awaitable

import asyncpg
import numpy as np
import pytest
from pgvector.asyncpg import register_vector

from shared.db import SEARCH_PATH
from shared.domain.principal import Principal
from shared.domain.search import FragmentFilter
from shared.embeddings import load_embedder
from shared.repositories import retrieval
from tests.support import Stack, unique


@pytest.fixture
async def conn(stack: Stack):  # type: ignore[no-untyped-def]
    c = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(c)
    await c.execute("SET hnsw.iterative_scan = relaxed_order")
    yield c
    await c.close()


async def test_lexical_layer_scopes_postings_to_the_workspace_plus_global(stack: Stack, conn: asyncpg.Connection) -> None:
    """L2 reads the postings with "this workspace or global" as one index condition (global
    postings spell the workspace ''): a global fragment is a lexical candidate under any
    workspace filter, another workspace's never, another tenant's never; document
    frequencies count the same scope."""
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    other, _ = await create_api_key(stack.database_url)
    ws, elsewhere = unique(), unique()
    term = f"zephyrine{unique().replace('-', '')[-8:]}"
    async with mcp_session(stack.mcp_url, key) as s:
        inside = await call(s, "remember", {"content": f"The {term} cluster runs in this workspace.", "topic": "ops", "type": "fact", "workspace": ws})
        glob = await call(s, "remember", {"content": f"Every team shares the {term} runbook.", "topic": "ops", "type": "fact"})
        away = await call(s, "remember", {"content": f"The {term} mirror runs somewhere else.", "topic": "ops", "type": "fact", "workspace": elsewhere})
    async with mcp_session(stack.mcp_url, other) as s:
        foreign = await call(s, "remember", {"content": f"Another tenant's {term} notes.", "topic": "ops", "type": "fact"})
    assert await conn.fetchval("SELECT workspace FROM fragment_terms WHERE fragment_id = $1 LIMIT 1", glob["id"]) == ""

    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    flt = FragmentFilter(workspace=ws)
    terms = await retrieval.query_terms(conn, term, [])
    dfs = await retrieval.document_frequencies(conn, principal, flt, terms)
    assert dfs[term] == 2  # this workspace's and the global one
    stats = retrieval.term_stats(dfs, 10)
    found, _ = await retrieval.bm25_candidates(conn, principal, flt, stats, dfs, 10)
    assert {i for i, _ in found} == {inside["id"], glob["id"]}
    assert not {away["id"], foreign["id"]} & {i for i, _ in found}
    # Unscoped: every workspace of the tenant, still not the other tenant.
    everywhere, _ = await retrieval.bm25_candidates(conn, principal, FragmentFilter(), stats, dfs, 10)
    assert {i for i, _ in everywhere} == {inside["id"], glob["id"], away["id"]}


async def test_passages_follow_the_content_and_pool_rows_read_the_best_one(stack: Stack, conn: asyncpg.Connection) -> None:
    """A multi-sentence fragment is stored with its passage vectors (shared.domain.passages)
    by every write path; they are replaced when an amend changes the content, carried over
    when a supersede keeps it, and gone with the fragment. pool_rows returns the best
    passage's cosine and the label."""
    from shared.domain import passages
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    long = ("[9:00 am on 3 May, 2024] Melanie: We went camping by the lake last weekend. The kids loved the canoe. "
            "I finished a pottery bowl on Sunday. Work has been busy.")
    short = "[9:05 am on 3 May, 2024] Caroline: That sounds like a lovely weekend."
    async with mcp_session(stack.mcp_url, key) as s:
        fid = (await call(s, "remember", {"content": long, "topic": "chat", "type": "episode", "workspace": ws}))["id"]
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": short, "topic": "chat", "type": "episode"}, {"content": long + " Bye.", "topic": "chat", "type": "episode"}]})
    short_id, batch_long = (r["id"] for r in batch["results"])

    async def stored(fragment_id: str) -> list:  # type: ignore[type-arg]
        return [r["embedding"] for r in await conn.fetch(
            "SELECT embedding FROM fragment_passages WHERE fragment_id = $1 ORDER BY ordinal", fragment_id)]

    embedder = load_embedder()
    expected = embedder.embed(passages.passages(long))
    got = await stored(fid)
    assert len(got) == len(expected) == 2
    for vector, want in zip(got, expected, strict=True):
        assert float(np.dot(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, want)) > 0.999
    assert await stored(short_id) == []  # one sentence: its own embedding is its passage
    assert len(await stored(batch_long)) == 3

    query = embedder.embed(["who made a pottery bowl?"])[0]
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    rows = await retrieval.pool_rows(conn, principal, [fid, short_id], [], query)
    best = max(float(np.dot(query, v)) for v in expected)
    assert rows[fid].passage_cosine == pytest.approx(best, abs=1e-4)
    assert rows[fid].passage_cosine > rows[fid].cosine  # the bowl sentence beats the whole turn
    assert rows[short_id].passage_cosine is None
    assert (rows[fid].label, rows[fid].label_lexemes) == ("Melanie", ("melani",))
    assert rows[short_id].label == "Caroline"
    stranger = Principal(key_id="nobody", visible_key_ids=("nobody",))
    assert await retrieval.pool_rows(conn, stranger, [fid], [], query) == {}

    # The query terms' counts: every term a row holds, none it lacks, and a row holding none
    # of them (gated, not unnested) has no counts.
    counts = {r["id"]: {u: n for u, n in zip(r["lexemes"], r["tfs"], strict=True)} for r in await conn.fetch(
        "SELECT f.id, array_agg(u.lexeme) AS lexemes, array_agg(greatest(coalesce(cardinality(u.positions), 1), 1)) AS tfs"
        " FROM fragments f, unnest(f.search_tsv) u WHERE f.id = ANY($1::text[]) GROUP BY f.id", [fid, short_id])}
    only_long = sorted(set(counts[fid]) - set(counts[short_id]))
    shared = sorted(set(counts[fid]) & set(counts[short_id]))
    assert only_long and shared
    terms = [only_long[0], shared[0], "zzzabsent"]
    rows = await retrieval.pool_rows(conn, principal, [fid, short_id], terms, query)
    assert rows[fid].tf == {t: counts[fid][t] for t in terms[:2]}
    assert rows[short_id].tf == {shared[0]: counts[short_id][shared[0]]}
    rows = await retrieval.pool_rows(conn, principal, [fid, short_id], [only_long[0]], query)
    assert rows[short_id].tf == {} and rows[fid].tf == {only_long[0]: counts[fid][only_long[0]]}

    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "amend", {"id": fid, "content": "Melanie: One line now. And a second. And a third. And a fourth. And a fifth."})
        assert len(await stored(fid)) == 3
        await call(s, "amend", {"id": fid, "content": "Melanie: Just one line now."})
        assert await stored(fid) == []
        successor = (await call(s, "amend", {"id": batch_long, "importance": 0.9, "supersedes": True}))["id"]
        assert len(await stored(successor)) == 3 and len(await stored(batch_long)) == 3
        await call(s, "forget", {"id": successor})
    assert await stored(successor) == []


async def _keyword_scores(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, keywords: list[str], vector: np.ndarray | None = None
) -> dict[str, float]:
    """The layered search's scores for a keyword query (no feedback round: two runs over the
    same fragments rank the same pool). Callers filter on a topic of their own: closing an
    MCP session writes reflected fragments into the workspace."""
    from services.recall.search import DocumentFrequencies, SearchRequest, layered_search

    async def embedded() -> np.ndarray:
        assert vector is not None
        return vector

    req = SearchRequest(text=None, keywords=keywords, vector=embedded() if vector is not None else None,
                        semantic_label="L3kw", threshold=None, filter_only=False)
    outcome = await layered_search(conn, principal, flt, req, 4, DocumentFrequencies())
    return {h.id: h.score for h in outcome.hits}


async def test_a_query_naming_a_label_gets_the_field_bonus_in_the_layered_search(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wiring from pool_rows' label through to the ranking: the fragment whose label the
    query names scores exactly LABEL_WEIGHT more than without the field, the others the same
    (a keyword query: no feedback round, so both runs rank the same pool)."""
    from services.recall import fusion
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws, topic = unique(), unique()
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": "Priya: the migration finished on Tuesday.", "topic": topic, "type": "fact"},
            {"content": "Marco: the migration of Priya's service is next.", "topic": topic, "type": "fact"},
        ]})
    said, about = (r["id"] for r in reply["results"])
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))

    def scores() -> Awaitable[dict[str, float]]:
        return _keyword_scores(conn, principal, FragmentFilter(workspace=ws, topic=topic), ["priya", "migration"])

    weight = fusion.LABEL_WEIGHT
    assert weight > 0
    with_field = await scores()
    monkeypatch.setattr(fusion, "LABEL_WEIGHT", 0.0)
    without = await scores()
    assert set(with_field) == set(without) == {said, about}
    assert with_field[said] - without[said] == pytest.approx(weight)
    assert with_field[about] == pytest.approx(without[about])


async def test_a_fragment_that_asks_loses_its_question_share_in_the_layered_search(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pool_rows' question share reaches the ranking: the fragment that is all question scores
    exactly QUESTION_WEIGHT less than without the penalty, the statement the same."""
    from services.recall import fusion
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws, topic = unique(), unique()
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": "Sam: how did the watercolor class go?", "topic": topic, "type": "fact"},
            {"content": "Evan: the watercolor class went well, a friend got me into it.", "topic": topic, "type": "fact"},
        ]})
    asks, answers = (r["id"] for r in reply["results"])
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))

    def scores() -> Awaitable[dict[str, float]]:
        return _keyword_scores(conn, principal, FragmentFilter(workspace=ws, topic=topic), ["watercolor", "class"])

    weight = fusion.QUESTION_WEIGHT
    assert weight > 0
    penalised = await scores()
    monkeypatch.setattr(fusion, "QUESTION_WEIGHT", 0.0)
    without = await scores()
    assert set(penalised) == set(without) == {asks, answers}
    assert without[asks] - penalised[asks] == pytest.approx(weight)
    assert penalised[answers] == pytest.approx(without[answers])


async def test_best_passage_enters_the_layered_search(
    stack: Stack, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pool_rows' best-passage cosine reaches the ranking: with PASSAGE_MIX at 0 the semantic
    feature is the whole-fragment cosine and the scores change (keywords + vector, no
    feedback round, so both runs rank the same pool)."""
    from services.recall import fusion
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws, topic = unique(), unique()
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": "Ops: The nightly backup runs at 02:00. Restores take forty minutes. The pager rotates weekly.",
             "topic": topic, "type": "fact"},
            {"content": "Ops: the backup bucket lives in the second region.", "topic": topic, "type": "fact"},
            {"content": "Ops: the backup job is owned by the platform team.", "topic": topic, "type": "fact"},
            {"content": "Ops: backups are encrypted with a key from the KMS.", "topic": topic, "type": "fact"},
        ]})
    ids = [r["id"] for r in reply["results"]]
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    query = load_embedder().embed(["how long does a restore take"])[0]

    def scores() -> Awaitable[dict[str, float]]:
        return _keyword_scores(conn, principal, FragmentFilter(workspace=ws, topic=topic), ["backup"], query)

    with_passages = await scores()
    monkeypatch.setattr(fusion, "PASSAGE_MIX", 0.0)
    without = await scores()
    assert set(with_passages) == set(without) == set(ids)
    # The restore sentence is closer to the question than the three-sentence fragment as a
    # whole, so its semantic feature rises; z-scored over the pool (mean 0 either way) that
    # lifts it against the pool's mean score.
    def lead(scores: dict[str, float]) -> float:
        return scores[ids[0]] - sum(scores.values()) / len(scores)

    assert lead(with_passages) > lead(without) + 1e-6


async def test_term_counts_are_the_postings_tf(stack: Stack, conn: asyncpg.Connection) -> None:
    """retrieval.term_counts reads a pooled fragment's counts from its own search_tsv; they are
    the counts its postings carry (what BM25 candidates were scored with), for every term,
    after an amend rewrote both, and only for the terms asked."""
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(stack.mcp_url, key) as s:
        fid = (await call(s, "remember", {
            "content": "Backups of the backup server back up the backups nightly; the restore drill restores them.",
            "topic": "backup ops", "type": "procedure", "keywords": ["backup", "restore"], "workspace": ws}))["id"]
        other = (await call(s, "remember", {"content": "The design review is on Thursday.", "topic": "design", "type": "fact", "workspace": ws}))["id"]

    async def postings() -> dict[str, dict[str, int]]:
        rows = await conn.fetch("SELECT fragment_id, term, tf FROM fragment_terms WHERE fragment_id = ANY($1::text[])", [fid, other])
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            out.setdefault(r["fragment_id"], {})[r["term"]] = r["tf"]
        return out

    want = await postings()
    assert max(want[fid].values()) > 1  # a term counted more than once
    every = sorted({t for counts in want.values() for t in counts})
    assert await retrieval.term_counts(conn, [fid, other], every) == want
    assert await retrieval.term_counts(conn, [fid, other], ["backup", "thursday", "absent"]) == {
        fid: {"backup": want[fid]["backup"]}, other: {"thursday": want[other]["thursday"]}}
    # pool_rows reads the same counts with the rows it ranks
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    pooled = await retrieval.pool_rows(conn, principal, [fid, other], every, None)
    assert {i: r.tf for i, r in pooled.items()} == want
    assert (await retrieval.pool_rows(conn, principal, [fid], ["absent"], None))[fid].tf == {}

    async with mcp_session(stack.mcp_url, key) as s:
        await call(s, "amend", {"id": fid, "content": "Restore drills restore the restored restore point weekly."})
    want = await postings()
    assert want[fid]["restor"] > 1
    assert await retrieval.term_counts(conn, [fid], sorted(want[fid])) == {fid: want[fid]}


async def test_counts_read_from_the_vector_text_keep_odd_lexemes(stack: Stack, conn: asyncpg.Connection) -> None:
    """term_counts, pool_rows and content_terms read a fragment's lexemes from its search_tsv
    written as text (quoted, quotes and backslashes doubled, positions after a colon): a stored
    fragment's lexemes with quotes, Hangul and URL parts come back as the postings hold them,
    counts included, and content_terms' weight-B counts as unnesting the vector counts them; a
    vector holding backslashes, spaces and colons, which the parsers never write, reads back as
    unnesting it does."""
    from tests.support import call, create_api_key, mcp_session

    key, key_id = await create_api_key(stack.database_url)
    ws = unique()
    content = (r"O'Neil's rock'n'roll backup at C:\tmp\x and \\srv\share; see https://ex.com/a?b='c'&d=\e "
               "for ops@ex.org: 서버가 재시작되면 캐시를 비운다, backup backup, v1.2.3-beta_4 it''s a\\'b")
    async with mcp_session(stack.mcp_url, key) as s:
        fid = (await call(s, "remember", {"content": content, "topic": "ops 'runbook'", "type": "procedure",
                                          "keywords": ["back\\slash", "it's", "x:1"], "workspace": ws}))["id"]
    rows = await conn.fetch("SELECT term, tf FROM fragment_terms WHERE fragment_id = $1", fid)
    want = {r["term"]: r["tf"] for r in rows}
    assert any("'" in t for t in want) and want["backup"] > 1  # a lexeme with quotes, a count above one
    every = sorted(want)
    assert await retrieval.term_counts(conn, [fid], every) == {fid: want}
    assert await retrieval.term_counts(conn, [fid], every[::3]) == {fid: {t: want[t] for t in every[::3]}}
    principal = Principal(key_id=key_id, visible_key_ids=(key_id,))
    assert (await retrieval.pool_rows(conn, principal, [fid], every, None))[fid].tf == want
    weight_b = await conn.fetch(
        "SELECT u.lexeme, (SELECT count(*) FROM unnest(u.weights) w WHERE w = 'B') AS n"
        " FROM fragments f, unnest(f.search_tsv) u WHERE f.id = $1", fid)
    assert await retrieval.content_terms(conn, [fid]) == {fid: {r["lexeme"]: r["n"] for r in weight_b if r["n"] > 0}}

    # Lexemes the parsers do not make but a vector can hold (array_to_tsvector, a restore):
    # backslashes, quotes, spaces, colons; positions with and without weights, and none.
    odd = await conn.fetchval(
        "SELECT setweight(array_to_tsvector(ARRAY['a''b', 'c\\d', 'sp ace', 'x:1']), 'A')"
        " || to_tsvector('simple', 'q q q') || array_to_tsvector(ARRAY['bare'])")
    reference = await conn.fetch("SELECT lexeme, positions FROM unnest($1::tsvector)", odd)
    assert retrieval._lexeme_counts(await conn.fetchval("SELECT $1::tsvector::text", odd)) == {
        r["lexeme"]: max(len(r["positions"] or ()), 1) for r in reference}
    assert {"a'b", "c\\d", "sp ace", "x:1", "bare"} <= {r["lexeme"] for r in reference}
