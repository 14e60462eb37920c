"""Read-side ranking SQL: BM25 over the full-text vectors, candidate scoring, neighbouring
turns and one-hop graph neighbours. Every query goes through filter_clauses / scope_clause."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import asyncpg
import numpy as np
from cachetools import LRUCache

from shared.domain.keywords import STOPWORDS
from shared.domain.passages import LEAD_MAX, label_of
from shared.domain.principal import Principal, SqlParams, scope_clause, scope_workspace_ranges
from shared.domain.search import FragmentFilter, question_share
from shared.repositories.fragments import filter_clauses, narrowing_clauses

# Okapi BM25 (Robertson & Zaragoza 2009); k1 0.9 / b 0.4 are Anserini's defaults for short
# passages and scored best on LoCoMo dev turns (0.744 vs 0.739 for 1.2 / 0.75).
BM25_K1 = 0.9
BM25_B = 0.4
# A term in more rows than this is counted as this many: its IDF is near zero anyway, and
# counting stops early instead of walking a huge posting list.
DF_CAP = 5000
# A scope's size (BM25's N) is counted exactly up to this many rows; a larger one is the
# planner's estimate (count_in_scope). Above 2 x DF_CAP the size only sets N: the dense-stop
# rule (search.DENSE_STOP_SHARE) leaves nothing out there, since document frequencies stop at
# DF_CAP, and N's error moves every IDF by about log(estimate / rows). The growth bench's 1M
# store (session 14, cold): the exact count of the master key's scope took 10.7 s and of a
# 350k-row workspace 2.4 s, once per new filter and every SCOPE_TOTAL_TTL_S: the 2-4 s max of
# every suite there since session 12. The planner's estimates of those two: 1,002,076 for
# 1,002,068 rows and 349,457 for 350,483.
SCOPE_COUNT_CAP = 2 * DF_CAP
# Rows the candidate-generating terms may match in total: the rarest terms are taken until
# their document frequencies add up to this (at least one). Common words still score, but do
# not drag tens of thousands of rows of a 100k store through ranking for little IDF; a
# 400-turn conversation rarely reaches it.
MATCH_BUDGET = 2000
# Candidates scored from the postings alone before the best of them are joined back to
# fragments for the filters the postings don't carry; more when such filters are set (they
# may reject many).
PRE_RANK = 300
PRE_RANK_FILTERED = 2000
# A lone candidate term with more rows than MATCH_BUDGET is read in impact order
# (fragment_terms_impact, migration 0023): one read per tf value below this, shortest
# fragments first, each stopped after the pre-rank it could fill; rows with a larger tf
# (rare: long fragments repeating the word) are one more read. The exact BM25 top of the
# term, at a cost set by the pre-rank instead of the posting list's length.
IMPACT_TF_STREAMS = 8
# The average fragment length of that path comes from this many of the term's postings
# (the whole list is what it no longer reads).
AVGDL_SAMPLE = 500


# Neighbouring turns are looked for among this many turns of the session each side of a hit.
NEIGHBOUR_SCAN = 8


@dataclass
class TermStats:
    """Query terms with their IDF in the caller's filtered scope."""

    idf: dict[str, float]
    total: int

    @property
    def terms(self) -> list[str]:
        return list(self.idf)


async def query_terms(conn: asyncpg.Connection, text: str, extra: list[str]) -> list[str]:
    """The query's lexemes as Postgres indexes them (english stemming) plus exact extras."""
    rows = await conn.fetchval(
        """
        SELECT array(SELECT DISTINCT t FROM (
            SELECT lexeme AS t FROM unnest(to_tsvector('english', $1))
            UNION ALL SELECT lower(x) FROM unnest($2::text[]) AS x
        ) q WHERE length(t) > 1)
        """,
        text, extra,
    )
    return list(rows or [])


async def document_frequencies(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, terms: list[str]
) -> dict[str, int]:
    """Fragments of the caller's tenant and workspace containing each term, counted up to
    DF_CAP: index-only scans over the postings (superseded and other sessions' working
    memory count too; IDF does not need them apart)."""
    if not terms:
        return {}
    params = SqlParams()
    where = _postings_scope(principal, flt, params)
    t = params.add(terms)
    sql = f"""
        SELECT q.term, (
            SELECT count(*) FROM (
                SELECT 1 FROM fragment_terms t WHERE t.term = q.term AND {where} LIMIT {params.add(DF_CAP)}
            ) c
        ) AS df
        FROM unnest({t}::text[]) AS q(term)
    """
    return {r["term"]: int(r["df"]) for r in await conn.fetch(sql, *params.values)}


def _postings_scope(principal: Principal, flt: FragmentFilter, params: SqlParams) -> str:
    """The filters the postings carry themselves: tenant, workspace (+ global, which the
    postings spell '' so that both are one index condition), type."""
    clauses = [scope_clause(principal.reads, params, "t")]
    if flt.workspace is not None:
        clauses.append(f"t.workspace = ANY(ARRAY[{params.add(flt.workspace)}, ''])")
    if flt.types:
        clauses.append(f"t.type = ANY({params.add(list(flt.types))}::text[])")
    return " AND ".join(clauses)


def term_stats(dfs: dict[str, int], total: int) -> TermStats:
    n = max(total, 1)
    return TermStats({t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in dfs.items() if df > 0}, n)


def _quoted(term: str) -> str:
    return "'" + term.replace("\\", "").replace("'", "''") + "'"


def _impact_postings(scope: str, term: str, idf: str, pre_rank: str) -> tuple[str, str]:
    """One term's best `pre_rank` postings in scope without reading its whole list, and the
    average fragment length from a sample of it (SQL of the `p` and `d` CTEs).

    BM25's weight of a term grows with tf and falls with dl, so among postings of one tf the
    shortest fragments are the best whatever the average length: the term's top `pre_rank`
    is among the first `pre_rank` of each tf's run of fragment_terms_impact (term, tf, dl, ...),
    read in index order (the tenant / workspace / type conditions are index conditions). The
    rare tf above IMPACT_TF_STREAMS are one more read, ordered by dl per occurrence. The sample
    follows fragment_terms_lookup's order (tenant, workspace, type, then insertion), not the
    impact index's, whose first rows are the shortest fragments."""
    postings = f"""
        SELECT s.fragment_id, s.tf::float8 AS tf, s.dl::float8 AS dl, {idf}::float8 AS idf
        FROM generate_series(1, {IMPACT_TF_STREAMS}) AS v(tf)
        CROSS JOIN LATERAL (
            SELECT t.fragment_id, t.tf, t.dl FROM fragment_terms t
            WHERE t.term = {term} AND t.tf = v.tf AND {scope}
            ORDER BY t.dl LIMIT {pre_rank}
        ) s
        UNION ALL
        (SELECT t.fragment_id, t.tf::float8, t.dl::float8, {idf}::float8 FROM fragment_terms t
         WHERE t.term = {term} AND t.tf > {IMPACT_TF_STREAMS} AND {scope}
         ORDER BY t.dl::float8 / t.tf LIMIT {pre_rank})
    """
    avgdl = f"""
        SELECT greatest(coalesce(avg(x.dl), 1), 1)::float8 AS avgdl FROM (
            SELECT t.dl FROM fragment_terms t WHERE t.term = {term} AND {scope}
            ORDER BY t.key_id, t.workspace, t.type LIMIT {AVGDL_SAMPLE}
        ) x
    """
    return postings, avgdl


async def bm25_candidates(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, stats: TermStats, dfs: dict[str, int], limit: int
) -> tuple[list[tuple[str, float]], float]:
    """L2: full-text matches in scope ranked by BM25. Returns (ranked, average doc length).

    Postings of the candidate-generating terms are scored without touching fragments; only
    the best PRE_RANK (more when filters the postings don't carry are set) are joined back
    for validity, working-memory scope and the recall filters. The fusion rescores the pool
    with every query term."""
    if not stats.idf:
        return [], 1.0
    # Candidates come from the rarest terms until their posting lists add up to MATCH_BUDGET
    # rows (at least one term); the other terms still count in the fusion.
    matching: list[str] = []
    budget = 0
    for term in sorted(stats.idf, key=lambda t: dfs[t]):
        if matching and budget + dfs[term] > MATCH_BUDGET:
            break
        matching.append(term)
        budget += dfs[term]
    params = SqlParams()
    scope = _postings_scope(principal, flt, params)
    where = " AND ".join(filter_clauses(principal, flt, params))
    pre_rank = params.add(PRE_RANK if not flt.narrows_beyond_postings() else PRE_RANK_FILTERED)
    if len(matching) == 1 and dfs[matching[0]] > MATCH_BUDGET:
        postings, avgdl_sql = _impact_postings(scope, params.add(matching[0]), params.add(stats.idf[matching[0]]), pre_rank)
    else:
        terms = params.add(matching)
        idfs = params.add([stats.idf[t] for t in matching])
        postings = f"""
            SELECT t.fragment_id, t.tf::float8 AS tf, t.dl::float8 AS dl, q.idf
            FROM unnest({terms}::text[], {idfs}::float8[]) AS q(term, idf)
            JOIN fragment_terms t ON t.term = q.term WHERE {scope}
        """
        avgdl_sql = "SELECT greatest(avg(p.dl), 1)::float8 AS avgdl FROM p"
    sql = f"""
        WITH p AS MATERIALIZED ({postings}),
        d AS ({avgdl_sql}),
        h AS (
            SELECT p.fragment_id, sum(p.idf * (p.tf * {BM25_K1 + 1}) /
                   (p.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * p.dl / d.avgdl))) AS score
            FROM p CROSS JOIN d GROUP BY p.fragment_id ORDER BY score DESC LIMIT {pre_rank}
        )
        SELECT h.fragment_id AS id, h.score, (SELECT avgdl FROM d) AS avgdl
        FROM h JOIN fragments f ON f.id = h.fragment_id
        WHERE {where}
        ORDER BY h.score DESC LIMIT {params.add(limit)}
    """
    rows = await conn.fetch(sql, *params.values)
    avgdl = float(rows[0]["avgdl"]) if rows else 1.0
    return [(r["id"], float(r["score"])) for r in rows], avgdl


@dataclass(frozen=True)
class ScopeCount:
    """A scope's fragment count: `exact` below SCOPE_COUNT_CAP, else the planner's estimate."""

    rows: int
    exact: bool


def count_statement(principal: Principal, flt: FragmentFilter) -> tuple[str, list[object]]:
    """count_in_scope's count, up to SCOPE_COUNT_CAP: the scope as disjoint ranges of
    fragments_scope_vectors (scope_workspace_ranges, whose union is filter_clauses'
    tenant and workspace scope), which carries the validity and session columns the corpus
    filter tests, so the count reads the index only (where the visibility map is set, which
    the maintenance VACUUM keeps). Written as one OR of a workspace and its
    global rows it was a bitmap heap scan: at 1M, a 150k-row workspace's count built a
    150k-row bitmap and read 10k heap pages, 70 ms warm and 160-300 ms when the heap was not
    cached, once per scope and replica every SCOPE_TOTAL_TTL_S (the filtered suite's p99
    through MCP); by ranges, 10 ms and 3k index buffers (bench/README.md, session 21)."""
    params = SqlParams()
    narrowing = " AND ".join(narrowing_clauses(flt, params)) or "TRUE"
    ranges = [
        f"SELECT 1 FROM fragments f WHERE {rng} AND {narrowing}" for rng in scope_workspace_ranges(principal.reads, flt.workspace, params)
    ] or ["SELECT 1 WHERE FALSE"]
    return f"SELECT count(*) FROM ({' UNION ALL '.join(ranges)} LIMIT {SCOPE_COUNT_CAP}) s", params.values


async def count_in_scope(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter) -> ScopeCount:
    """Fragments in the caller's filtered scope, counted up to SCOPE_COUNT_CAP; a scope at
    the cap is the planner's row estimate of the same WHERE (no rows read), at least the cap.
    The estimate is planned from this call's own values: a statement prepared afresh (asyncpg's
    prepare() bypasses its cache) is planned custom, where a cached one turns generic after
    five runs and would estimate any workspace as the average one."""
    sql, values = count_statement(principal, flt)
    counted = int(await conn.fetchval(sql, *values))
    if counted < SCOPE_COUNT_CAP:
        return ScopeCount(counted, exact=True)
    params = SqlParams()
    rows = f"SELECT 1 FROM fragments f WHERE {' AND '.join(filter_clauses(principal, flt, params))}"
    plan = await (await conn.prepare(f"EXPLAIN (FORMAT JSON) {rows}")).fetchval(*params.values)
    estimate = int(json.loads(plan)[0]["Plan"]["Plan Rows"])
    return ScopeCount(max(SCOPE_COUNT_CAP, estimate), exact=False)


@dataclass
class PooledFragment:
    id: str
    tf: dict[str, int]
    dl: int
    cosine: float | None
    importance: float
    activation: float
    age_days: float
    passage_cosine: float | None = None  # the best of its passages', if it has any
    label: str = ""  # shared.domain.passages.label_of
    label_lexemes: tuple[str, ...] = ()
    asks: float = 0.0  # shared.domain.search.question_share of its first QUESTION_TEXT_MAX characters


# How much of a pooled fragment's text is read to tell how much of it asks questions.
QUESTION_TEXT_MAX = 1000


# Lexemes of fragment labels (shared.domain.passages.label_of), by label: a store's labels
# are few (its speakers, its subjects) and each is analysed once per process. A label's
# lexemes never change, so no TTL; the bound only caps what many distinct labels can cost.
LABEL_CACHE_MAX = 10_000
_LABEL_LEXEMES: LRUCache[str, tuple[str, ...]] = LRUCache(LABEL_CACHE_MAX)


async def label_lexemes(conn: asyncpg.Connection, labels: set[str]) -> dict[str, tuple[str, ...]]:
    missing = [label for label in labels if label not in _LABEL_LEXEMES]
    if missing:
        for r in await conn.fetch(
            "SELECT l, tsvector_to_array(to_tsvector('english', l)) AS lexemes FROM unnest($1::text[]) l", missing
        ):
            _LABEL_LEXEMES[r["l"]] = tuple(r["lexemes"])
    return {label: _LABEL_LEXEMES.get(label, ()) for label in labels}


async def pool_rows(
    conn: asyncpg.Connection, principal: Principal, ids: list[str], terms: list[str], embedding: np.ndarray | None
) -> dict[str, PooledFragment]:
    """What ranking needs of each pooled fragment: length, cosine to the query, priors, and
    the query terms' counts (as the postings count them: _counts_of)."""
    if not ids:
        return {}
    params = SqlParams()
    scope = scope_clause(principal.reads, params)
    id_list = params.add(ids)
    cosine = passage_cosine = "NULL::float8"
    if embedding is not None:
        vec = params.add(embedding)
        # The fragment's vector is half precision (migration 0034), its passages' are float.
        cosine = f"1 - (f.embedding <=> {vec}::vector::halfvec)"
        passage_cosine = f"(SELECT max(1 - (p.embedding <=> {vec}::vector)) FROM fragment_passages p WHERE p.fragment_id = f.id)"
    # Passages are read only while the fragment's own embedding is current (a content change
    # clears the embedding until the backfill replaces both).
    sql = f"""
        SELECT f.id, f.importance, f.ema_activation, length(f.search_tsv) AS dl,
               extract(epoch FROM now() - f.created_at) / 86400.0 AS age_days,
               CASE WHEN f.embedding IS NULL THEN NULL ELSE {cosine} END AS cosine,
               CASE WHEN f.embedding IS NULL THEN NULL ELSE {passage_cosine} END AS passage_cosine,
               left(f.content, {max(LEAD_MAX + 1, QUESTION_TEXT_MAX)}) AS head, {_counts_of(params.add(terms))} AS counted
        FROM fragments f WHERE f.id = ANY({id_list}::text[]) AND {scope}
    """
    out = {}
    for r in await conn.fetch(sql, *params.values):
        out[r["id"]] = PooledFragment(
            r["id"], _lexeme_counts(r["counted"]), int(r["dl"]), None if r["cosine"] is None else float(r["cosine"]),
            float(r["importance"]), float(r["ema_activation"]), float(r["age_days"]),
            None if r["passage_cosine"] is None else float(r["passage_cosine"]), label_of(r["head"]),
            asks=question_share(r["head"]),
        )
    lexemes = await label_lexemes(conn, {row.label for row in out.values() if row.label})
    for row in out.values():
        row.label_lexemes = lexemes.get(row.label, ())
    return out


# One lexeme of a tsvector written as text: quoted, a quote or backslash in it doubled, then its
# positions (each with its weight letter, D left out) after a colon, if it has any.
_TSV_LEXEME = re.compile(r"'((?:[^']|'')*)'(?::(\S+))?")
_TSV_ESCAPE = re.compile(r"''|\\\\")


def _lexeme_counts(written: str) -> dict[str, int]:
    """Each lexeme of a tsvector's text form with its count, as the postings count it (the
    fragment_terms triggers of migration 0006): its positions, at least one."""
    return {
        _TSV_ESCAPE.sub(lambda e: e.group(0)[0], m.group(1)): m.group(2).count(",") + 1 if m.group(2) else 1
        for m in _TSV_LEXEME.finditer(written)
    }


def _counts_of(terms: str) -> str:
    """SQL for the fragment `f`'s search_tsv cut to the `terms` (a text[] parameter), as text
    for _lexeme_counts: the vector without every lexeme that is not a term (ts_delete twice,
    C functions over the row's own vector). Read with the row, instead of one probe of the
    postings index per fragment (8 GB at 1M fragments, where those probes were 2-10 ms of a
    query). This replaced a lateral subquery that unnested the vector of every fragment holding
    a term: on the 100k growth store, pool_rows' statement over 250 pooled ids took 4.5-4.9 ms
    against 5.9-6.6 ms with it, the subquery's executor set up again for every row (bench/README.md,
    session 36)."""
    return f"ts_delete(f.search_tsv, tsvector_to_array(ts_delete(f.search_tsv, {terms}::text[])))::text"


async def term_counts(conn: asyncpg.Connection, ids: list[str], terms: list[str]) -> dict[str, dict[str, int]]:
    """Counts of `terms` in fragments already read through the caller's scope (the pool), as
    pool_rows reads them (_counts_of); fragments with none of the terms are left out."""
    if not ids or not terms:
        return {}
    rows = await conn.fetch(f"SELECT f.id, {_counts_of('$2')} AS counted FROM fragments f WHERE f.id = ANY($1::text[])", ids, terms)
    return {r["id"]: counts for r in rows if (counts := _lexeme_counts(r["counted"]))}


async def content_terms(conn: asyncpg.Connection, ids: list[str]) -> dict[str, dict[str, int]]:
    """Each fragment's content lexemes (weight B: prose and Korean morphemes, not topic or
    keywords) with their counts, for pseudo-relevance feedback over already-ranked hits."""
    if not ids:
        return {}
    # ts_filter keeps the weight-B positions, and the lexemes that have one.
    rows = await conn.fetch("SELECT f.id, ts_filter(f.search_tsv, '{b}')::text AS tf FROM fragments f WHERE f.id = ANY($1::text[])", ids)
    return {r["id"]: _lexeme_counts(r["tf"]) for r in rows}


_STOP_LEXEMES: frozenset[str] | None = None


async def stop_lexemes(conn: asyncpg.Connection) -> frozenset[str]:
    """The extractor's stop words as the english configuration stems them (computed once)."""
    global _STOP_LEXEMES  # noqa: PLW0603 - a constant of the english configuration, computed once
    if _STOP_LEXEMES is None:
        lexemes = await conn.fetchval(
            "SELECT array(SELECT lexeme FROM unnest(to_tsvector('english', $1)))", " ".join(sorted(STOPWORDS))
        )
        _STOP_LEXEMES = frozenset(lexemes or ())
    return _STOP_LEXEMES


async def turn_neighbours(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, ids: list[str], width: int = 2
) -> dict[str, tuple[list[str], list[str]]]:
    """The `width` fragments stored just before and just after each one in the same session
    and topic (one thread of conversation; seq order, nearest first) that pass the filters,
    looked for among the NEIGHBOUR_SCAN nearest turns of the session each side: a selective
    filter in a long session must not walk all of it. Those turns are read from the index
    alone (fragments_session_seq_topic carries topic and id); only turns in the topic are
    fetched for the filters."""
    if not ids:
        return {}
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params, alias="n"))
    id_list = params.add(ids)
    w = params.add(width)
    scan = params.add(NEIGHBOUR_SCAN)
    sql = f"""
        SELECT c.id,
            array(SELECT n.id FROM (SELECT x.id, x.seq, x.topic FROM fragments x
                                    WHERE x.session_id = c.session_id AND x.seq < c.seq ORDER BY x.seq DESC LIMIT {scan}) s
                  JOIN fragments n ON n.id = s.id
                  WHERE s.topic = c.topic AND {where} ORDER BY s.seq DESC LIMIT {w}) AS before,
            array(SELECT n.id FROM (SELECT x.id, x.seq, x.topic FROM fragments x
                                    WHERE x.session_id = c.session_id AND x.seq > c.seq ORDER BY x.seq ASC LIMIT {scan}) s
                  JOIN fragments n ON n.id = s.id
                  WHERE s.topic = c.topic AND {where} ORDER BY s.seq ASC LIMIT {w}) AS after
        FROM fragments c WHERE c.id = ANY({id_list}::text[]) AND c.session_id IS NOT NULL
    """
    rows = await conn.fetch(sql, *params.values)
    return {r["id"]: (list(r["before"]), list(r["after"])) for r in rows}


async def graph_neighbours(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, ids: list[str], limit: int
) -> list[tuple[str, str, str, float]]:
    """L2.5: one hop over fragment_links from the seeds, to fragments the caller may read
    and that pass the recall filters. Rows are (seed, neighbour, relation, weight)."""
    if not ids:
        return []
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params, alias="f"))
    id_list = params.add(ids)
    sql = f"""
        SELECT e.seed, f.id, e.relation_type, e.weight FROM (
            SELECT l.from_id AS seed, l.to_id AS other, l.relation_type, l.weight
            FROM fragment_links l WHERE l.from_id = ANY({id_list}::text[])
            UNION ALL
            SELECT l.to_id, l.from_id, l.relation_type, l.weight
            FROM fragment_links l WHERE l.to_id = ANY({id_list}::text[])
        ) e JOIN fragments f ON f.id = e.other
        WHERE e.relation_type NOT IN ('superseded_by', 'co_retrieved') AND {where}
        ORDER BY e.weight DESC LIMIT {params.add(limit)}
    """
    rows = await conn.fetch(sql, *params.values)
    return [(r["seed"], r["id"], r["relation_type"], float(r["weight"])) for r in rows]
