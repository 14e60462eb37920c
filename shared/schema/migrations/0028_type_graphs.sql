-- A filtered recall that names one type walks that type's own HNSW graph.
--
-- A scope too broad to rank exactly (past vector_search's exact cap, ~31k rows at 1M) walks
-- HNSW with the filters inside the scan, visiting about k / selectivity tuples before k of
-- them pass. In the whole table's graph a workspace + type + importance scope is a few percent
-- of the rows; in its type's graph it is a few times that, so the walk visits a few times
-- fewer tuples. At 1M on the growth bench's store, the filtered suite's single-type queries
-- whose scope is past the cap (114 of 150 `fact` queries), the same statement with and without
-- the type's graph, interleaved per query: p50 / p95 24.8 / 49.1 -> 15.3 / 26.0 ms
-- (bench/README.md, session 18). The planner takes the partial index by itself: nearest()
-- plans every statement for its parameters, so `type = ANY('{fact}')` proves `type = 'fact'`.
-- A query naming several types, or none, walks fragments_embedding_hnsw as before.
--
-- One graph per type in fragments_type_check; a type added there needs its graph here too
-- (tests/recall/test_filtered_vector.py checks). Cost: every row sits in two graphs, about
-- the whole graph's size again on disk (2.0 GB at 1M) and a second graph insert per write, into
-- a graph of that type's rows only: at 1M, batch_remember through MCP 211-213 -> 157-163
-- fragments/s; on a fresh LoCoMo stack 1.4 -> 1.8 ms of Postgres CPU a turn. The build holds
-- the write lock: ~5 minutes at 1M here. A write-heavy store that never filters by one type can
-- drop these indexes: the planner then walks fragments_embedding_hnsw, as before.
SET search_path = agent_memory, public;

DO $$
DECLARE
    kind text;
BEGIN
    FOREACH kind IN ARRAY ARRAY['fact', 'decision', 'error', 'preference', 'procedure', 'relation', 'episode'] LOOP
        EXECUTE format(
            'CREATE INDEX IF NOT EXISTS %I ON fragments USING hnsw (embedding vector_cosine_ops)'
            ' WITH (m = 16, ef_construction = 64) WHERE type = %L',
            'fragments_embedding_hnsw_' || kind, kind
        );
    END LOOP;
END
$$;
