-- Postings in BM25 impact order within a term: recall's lexical layer reads a common term's
-- best postings instead of its whole posting list.
--
-- When every query term is common, candidates come from the rarest one alone, scored by its
-- BM25 weight; at 1.1M fragments that read 5-90k postings a query (26 ms p50, 63 ms p95 of
-- the lexical layer). A term's weight in a fragment grows with tf and falls with dl, so for
-- one tf value the shortest fragments are the best ones whatever the average length: one
-- ordered read per tf value (term, tf, dl), each stopped after the candidates it can
-- contribute, holds the term's exact BM25 top (bm25_candidates, "impact order").
--
-- The tenant / workspace / type columns follow dl in the key, so a scoped read is an index
-- condition (Postgres 18 skips from one dl value to the next) rather than a filter. Additive:
-- fragment_terms_lookup stays for document frequencies and the exact path of short lists.
SET search_path = agent_memory, public;

SET LOCAL maintenance_work_mem = '256MB';
CREATE INDEX IF NOT EXISTS fragment_terms_impact
    ON fragment_terms (term, tf, dl, key_id, workspace, type) INCLUDE (fragment_id);
