"""Read-side ranking SQL: BM25 over the full-text vectors, candidate scoring, neighbouring
turns and one-hop graph neighbours. Every query goes through filter_clauses / read_scope."""

from __future__ import annotations

import math
from dataclasses import dataclass

import asyncpg
import numpy as np

from shared.domain.principal import Principal, SqlParams, read_scope
from shared.domain.search import FragmentFilter
from shared.repositories.fragments import filter_clauses

# Okapi BM25 (Robertson & Zaragoza 2009); k1 0.9 / b 0.4 are Anserini's defaults for short
# passages and scored best on LoCoMo dev turns (0.744 vs 0.739 for 1.2 / 0.75).
BM25_K1 = 0.9
BM25_B = 0.4
# A term in more rows than this is counted as this many: its IDF is near zero anyway, and
# counting stops early instead of walking a huge posting list.
DF_CAP = 5000
# Terms in more rows than this still score but do not generate candidates (unless fewer than
# MIN_MATCH_TERMS terms are rarer): a word in 5% of a 100k store would otherwise drag tens of
# thousands of rows through ranking for little IDF. A 400-turn conversation never reaches it.
MATCH_DF_CAP = 2000
MIN_MATCH_TERMS = 3
# Full-text matches pre-ranked by ts_rank before BM25 scores them (bounds the work when a
# common term matches a large share of a 100k store).
PRE_RANK = 400


@dataclass
class TermStats:
    """Query terms with their IDF in the caller's filtered scope."""

    idf: dict[str, float]
    total: int

    @property
    def terms(self) -> list[str]:
        return list(self.idf)


async def lexical_search(
    conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter, text: str, extra: list[str], total: int, limit: int
) -> tuple[list[tuple[str, float]], TermStats, float]:
    """L2 in one round trip: the query's lexemes (english stemming, as indexed, plus exact
    extras), their document frequency in the caller's filtered scope, and the full-text
    matches ranked by BM25. Returns (ranked, term stats, average doc length)."""
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params))
    txt, ext = params.add(text), params.add(extra)
    n = params.add(max(total, 1))
    sql = f"""
        WITH terms AS (
            SELECT DISTINCT t AS term FROM (
                SELECT lexeme AS t FROM unnest(to_tsvector('english', {txt}))
                UNION ALL SELECT lower(x) FROM unnest({ext}::text[]) AS x
            ) s WHERE length(t) > 1
        ),
        df AS (
            SELECT terms.term, (
                SELECT count(*) FROM (
                    SELECT 1 FROM fragments f
                    WHERE f.search_tsv @@ to_tsquery('simple', quote_literal(terms.term)) AND {where}
                    LIMIT {params.add(DF_CAP)}
                ) c
            ) AS df FROM terms
        ),
        q AS (SELECT term, ln(1 + ({n}::float8 - df + 0.5) / (df + 0.5)) AS idf FROM df WHERE df > 0),
        tq AS (
            SELECT to_tsquery('simple', string_agg(quote_literal(term), ' | ')) AS query FROM (
                SELECT term FROM df WHERE df > 0 ORDER BY df
                LIMIT greatest((SELECT count(*) FROM df WHERE df > 0 AND df < {params.add(MATCH_DF_CAP)}), {MIN_MATCH_TERMS})
            ) rare
        ),
        m AS MATERIALIZED (
            SELECT f.id, f.search_tsv FROM fragments f, tq
            WHERE tq.query IS NOT NULL AND f.search_tsv @@ tq.query AND {where}
            ORDER BY ts_rank(f.search_tsv, tq.query) DESC
            LIMIT {params.add(PRE_RANK)}
        ),
        d AS (SELECT greatest(avg(length(m.search_tsv)), 1)::float8 AS avgdl FROM m),
        ranked AS (
            SELECT m.id, {_bm25_expr('m', 'q', '(SELECT avgdl FROM d)')} AS score FROM m
            ORDER BY score DESC LIMIT {params.add(limit)}
        )
        SELECT (SELECT array_agg(term) FROM q) AS terms, (SELECT array_agg(idf) FROM q) AS idfs,
               (SELECT avgdl FROM d) AS avgdl,
               (SELECT array_agg(id ORDER BY score DESC) FROM ranked) AS ids,
               (SELECT array_agg(score ORDER BY score DESC) FROM ranked) AS scores
    """
    row = await conn.fetchrow(sql, *params.values)
    stats = TermStats(dict(zip(row["terms"] or [], (float(x) for x in row["idfs"] or []))), max(total, 1))
    ranked = list(zip(row["ids"] or [], (float(x) for x in row["scores"] or [])))
    return ranked, stats, float(row["avgdl"] or 1.0)


async def count_in_scope(conn: asyncpg.Connection, principal: Principal, flt: FragmentFilter) -> int:
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params))
    return int(await conn.fetchval(f"SELECT count(*) FROM fragments f WHERE {where}", *params.values))


def _bm25_expr(alias: str, q: str, avgdl: str) -> str:
    """BM25 of row `alias` against the (term, idf) rows of `q`; dl = distinct lexemes."""
    tf = "coalesce(cardinality(u.positions), 1)::float8"
    return f"""coalesce((
        SELECT sum(q.idf * ({tf} * {BM25_K1 + 1}) /
                   ({tf} + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * length({alias}.search_tsv) / {avgdl})))
        FROM unnest({alias}.search_tsv) u JOIN {q} q ON q.term = u.lexeme
    ), 0)"""


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
        WITH q AS (SELECT * FROM unnest({terms}::text[], {idfs}::float8[]) AS q(term, idf))
        SELECT f.id, f.session_id, f.importance, f.ema_activation,
               extract(epoch FROM now() - f.created_at) / 86400.0 AS age_days,
               {_bm25_expr('f', 'q', f'{dl}::float8')} AS bm25,
               CASE WHEN f.embedding IS NULL THEN NULL ELSE {cosine} END AS cosine
        FROM fragments f WHERE f.id = ANY({id_list}::text[]) AND {scope}
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
    """The fragments stored just before and after each one in the same session (seq order)."""
    if not ids:
        return {}
    params = SqlParams()
    where = " AND ".join(filter_clauses(principal, flt, params, alias="n"))
    id_list = params.add(ids)
    w = params.add(width)
    sql = f"""
        SELECT c.id, array(
            (SELECT n.id FROM fragments n WHERE n.session_id = c.session_id AND n.seq < c.seq AND {where}
             ORDER BY n.seq DESC LIMIT {w})
            UNION ALL
            (SELECT n.id FROM fragments n WHERE n.session_id = c.session_id AND n.seq > c.seq AND {where}
             ORDER BY n.seq ASC LIMIT {w})
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
