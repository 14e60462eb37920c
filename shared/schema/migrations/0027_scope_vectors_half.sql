-- The exact ranking's covering index carries each row's embedding in half precision.
--
-- Ranking a scope exactly reads one covering-index tuple per row (0026), and with the 1.5 KB
-- float vector a tuple took ~2.6 KB with the btree's fill: ~3 rows a page, 9,275 buffers for a
-- 25.7k-row scope, 2.7 GB at 1M fragments. Scopes just under the exact cap were the filtered
-- recall's slowest queries there (bench/README.md, session 16). halfvec halves the vector:
-- the index is 1.0 GB at 1M, and ranking a 5-40k-row scope went from p50 / p95 15.3 / 50.0
-- and 14.3 / 31.3 ms to 12.4 / 27.1 and 10.7 / 20.9 (the same queries, interleaved). Its
-- order is the float order to within rounding (the top 60 shared 99.97-99.99% of their ids);
-- vector_search re-ranks a shortlist of twice k by the stored float vector, so what recall
-- returns, and the similarities it reports, are the float ones.
--
-- Cost: the heap carries the half vector too (~0.8 KB a row), a stored generated column, so
-- no write path can let the two disagree. Adding it rewrites the table and rebuilds its
-- indexes under the write lock (at 1M: minutes, most of it the HNSW graph).
SET search_path = agent_memory, public;

ALTER TABLE fragments ADD COLUMN IF NOT EXISTS embedding_half halfvec(384)
    GENERATED ALWAYS AS (embedding::halfvec(384)) STORED;

DROP INDEX IF EXISTS fragments_scope_vectors;
CREATE INDEX IF NOT EXISTS fragments_scope_vectors ON fragments (key_id, workspace, type, importance)
    INCLUDE (valid_to, scope, session_id, id, embedding_half);
