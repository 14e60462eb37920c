"""Read-side ranking SQL: BM25 over the full-text vectors, candidate scoring, neighbouring
turns and one-hop graph neighbours. Every query goes through filter_clauses / read_scope."""

from __future__ import annotations

import math
from dataclasses import dataclass

import asyncpg
import numpy as np

from shared.domain.principal import Principal, SqlParams, read_scope, workspace_scope
from shared.domain.search import FragmentFilter
from shared.repositories.fragments import filter_clauses

# Okapi BM25 (Robertson & Zaragoza 2009); k1 0.9 / b 0.4 are Anserini's defaults for short
# passages and scored best on LoCoMo dev turns (0.744 vs 0.739 for 1.2 / 0.75).
BM25_K1 = 0.9
BM25_B = 0.4
# A term in more rows than this is counted as this many: its IDF is near zero anyway, and
# counting stops early instead of walking a huge posting list.
DF_CAP = 5000
# Rows the candidate-generating terms may match in total: the rarest terms are taken until
# their document frequencies add up to this (at least one). Common words still score, but do
# not drag tens of thousands of rows of a 100k store through ranking for little IDF; a
# 400-turn conversation never reaches the budget (LoCoMo dev unchanged).
MATCH_BUDGET = 6000
# Candidates scored from the postings alone before the best of them are joined back to
# fragments for the filters the postings don't carry; more when such filters are set (they
# may reject many).
PRE_RANK = 300
PRE_RANK_FILTERED = 2000


# Neighbouring turns are looked for among this many turns each side of a hit.
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
    """The filters the postings carry themselves: tenant, workspace (+ global), type."""
    clauses = [read_scope(principal, params, "t"), workspace_scope(flt.workspace, params, "t")]
    if flt.types:
        clauses.append(f"t.type = ANY({params.add(list(flt.types))}::text[])")
    return " AND ".join(clauses)


def term_stats(dfs: dict[str, int], total: int) -> TermStats:
    n = max(total, 1)
    return TermStats({t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in dfs.items() if df > 0}, n)


def _quoted(term: str) -> str:
    return "'" + term.replace("\\", "").replace("'", "''") + "'"


async def bm25_candidates(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, stats: TermStats, dfs: dict[str, int], limit: int
) -> tuple[list[tuple[str, float]], float]:
    """L2: full-text matches in scope ranked by BM25. Returns (ranked, average doc length).

    Postings of the candidate-generating terms are scored without touching fragments; only
    the best PRE_RANK (more when filters the postings don't carry are set) are joined back
    for validity, working-memory scope and the recall filters. score_ids rescores the pool
    with every query term."""
    if not stats.idf:
        return [], 1.0
    # Candidates come from the rarest terms until their posting lists add up to MATCH_BUDGET
    # rows (at least one term); the other terms still count in score_ids.
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
    terms = params.add(matching)
    idfs = params.add([stats.idf[t] for t in matching])
    pre_rank = PRE_RANK if not flt.narrows_beyond_postings() else PRE_RANK_FILTERED
    sql = f"""
        WITH q AS (SELECT * FROM unnest({terms}::text[], {idfs}::float8[]) AS q(term, idf)),
        p AS MATERIALIZED (
            SELECT t.fragment_id, t.tf::float8 AS tf, t.dl::float8 AS dl, q.idf
            FROM q JOIN fragment_terms t ON t.term = q.term WHERE {scope}
        ),
        d AS (SELECT greatest(avg(p.dl), 1)::float8 AS avgdl FROM p),
        h AS (
            SELECT p.fragment_id, sum(p.idf * (p.tf * {BM25_K1 + 1}) /
                   (p.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * p.dl / d.avgdl))) AS score
            FROM p CROSS JOIN d GROUP BY p.fragment_id ORDER BY score DESC LIMIT {params.add(pre_rank)}
        )
        SELECT h.fragment_id AS id, h.score, (SELECT avgdl FROM d) AS avgdl
        FROM h JOIN fragments f ON f.id = h.fragment_id
        WHERE {where}
        ORDER BY h.score DESC LIMIT {params.add(limit)}
    """
    rows = await conn.fetch(sql, *params.values)
    avgdl = float(rows[0]["avgdl"]) if rows else 1.0
    return [(r["id"], float(r["score"])) for r in rows], avgdl


async def count_in_scope(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter) -> int:
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params))
    return int(await conn.fetchval(f"SELECT count(*) FROM fragments f WHERE {where}", *params.values))


@dataclass
class Scored:
    id: str
    bm25: float
    cosine: float | None
    importance: float
    activation: float
    age_days: float
    session_id: str | None


async def score_ids(
    conn: asyncpg.Connection,
    principal: Principal,
    ids: list[str],
    stats: TermStats,
    avgdl: float,
    embedding: np.ndarray | None,
) -> dict[str, Scored]:
    """BM25 and cosine similarity for given fragments (candidates and their context)."""
    if not ids:
        return {}
    params = SqlParams()
    scope = read_scope(principal, params)
    id_list = params.add(ids)
    terms = params.add(list(stats.idf))
    idfs = params.add(list(stats.idf.values()))
    dl = params.add(max(avgdl, 1.0))
    cosine = "NULL::float8"
    if embedding is not None:
        cosine = f"1 - (f.embedding <=> {params.add(embedding)})"
    sql = f"""
        WITH q AS (SELECT * FROM unnest({terms}::text[], {idfs}::float8[]) AS q(term, idf)),
        bm AS (
            -- per fragment, primary-key probes for the query's terms
            SELECT i.id AS fragment_id, s.score FROM unnest({id_list}::text[]) AS i(id)
            CROSS JOIN LATERAL (
                SELECT sum(q.idf * (t.tf * {BM25_K1 + 1}) /
                       (t.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * t.dl / {dl}::float8))) AS score
                FROM fragment_terms t JOIN q ON q.term = t.term
                WHERE t.fragment_id = i.id AND t.term = ANY({terms}::text[])
            ) s
        )
        SELECT f.id, f.session_id, f.importance, f.ema_activation,
               extract(epoch FROM now() - f.created_at) / 86400.0 AS age_days,
               coalesce(bm.score, 0) AS bm25,
               CASE WHEN f.embedding IS NULL THEN NULL ELSE {cosine} END AS cosine
        FROM fragments f LEFT JOIN bm ON bm.fragment_id = f.id
        WHERE f.id = ANY({id_list}::text[]) AND {scope}
    """
    rows = await conn.fetch(sql, *params.values)
    return {
        r["id"]: Scored(
            r["id"], float(r["bm25"]), None if r["cosine"] is None else float(r["cosine"]),
            float(r["importance"]), float(r["ema_activation"]), float(r["age_days"]), r["session_id"],
        )
        for r in rows
    }


async def turn_neighbours(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, ids: list[str], width: int = 1
) -> dict[str, list[str]]:
    """The fragments stored just before and after each one in the same session (seq order)
    that pass the filters, looked for among the NEIGHBOUR_SCAN nearest turns each side: a
    selective filter in a long session must not walk the whole session."""
    if not ids:
        return {}
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params, alias="n"))
    id_list = params.add(ids)
    w = params.add(width)
    scan = params.add(NEIGHBOUR_SCAN)
    sql = f"""
        SELECT c.id, array(
            (SELECT n.id FROM (SELECT * FROM fragments x WHERE x.session_id = c.session_id AND x.seq < c.seq
                               ORDER BY x.seq DESC LIMIT {scan}) n
             WHERE {where} ORDER BY n.seq DESC LIMIT {w})
            UNION ALL
            (SELECT n.id FROM (SELECT * FROM fragments x WHERE x.session_id = c.session_id AND x.seq > c.seq
                               ORDER BY x.seq ASC LIMIT {scan}) n
             WHERE {where} ORDER BY n.seq ASC LIMIT {w})
        ) AS around
        FROM fragments c WHERE c.id = ANY({id_list}::text[]) AND c.session_id IS NOT NULL
    """
    rows = await conn.fetch(sql, *params.values)
    return {r["id"]: list(r["around"]) for r in rows}


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
