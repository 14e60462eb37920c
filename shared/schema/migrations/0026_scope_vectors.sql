-- The exact ranking of a filtered recall reads its scope from an index, not from the heap.
--
-- A scope of s rows near the exact cap (~15.5k at 1M, k = 60) was found through the scope
-- indexes and ranked from the heap: one heap page per row, since a tenant's rows are
-- interleaved with everyone's (14,145 rows from 14,055 pages, 40 ms warm; the filtered
-- recall's p99 at 1M was 130-1,072 ms). This btree holds each row's embedding and every
-- column the recall filters test besides, in scope order, so the scope is one contiguous
-- range read index-only (vector_search.nearest_statement, principal.scope_ranges). At 60k rows a 3.4k-row scope read 1,164
-- index pages instead of 3,372 heap pages, 8 ms instead of 27. The narrow scope indexes stay:
-- counting a scope reads them, ~30x fewer pages.
--
-- Cost: the embedding a second time (~2.6 KB a row with the btree's fill), one more index
-- insert per write, and updates of importance or validity are not HOT (they were not already).
-- The build holds the write lock: 41 s at 1M rows here (two parallel workers).
SET search_path = agent_memory, public;

CREATE INDEX IF NOT EXISTS fragments_scope_vectors ON fragments (key_id, workspace, type, importance)
    INCLUDE (valid_to, scope, session_id, id, embedding);
