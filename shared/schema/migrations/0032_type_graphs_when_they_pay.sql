-- A type's own HNSW graph (0028) only where that type is large enough to need it.
--
-- Every write of a type goes into its type's graph as well as the whole table's: +0.4 ms of
-- Postgres CPU a LoCoMo turn (session 18), about a quarter of the write path's own. The graph
-- pays off only for a single-type scope past vector_search's exact cap, and how many tuples
-- the whole graph's walk visits for such a scope grows with the square root of the table, so
-- a small store walks the whole graph cheaply (shared/repositories/type_graphs.py). The graphs
-- of types with fewer than 100,000 rows by the planner's statistics (the default of
-- TYPE_GRAPH_MIN_ROWS; all of them on a new or never-analysed store) are dropped here; the
-- maintenance worker builds a type's graph, concurrently, once the type has that many rows.
SET search_path = agent_memory, public;

DO $$
DECLARE
    graph record;
BEGIN
    FOR graph IN
        SELECT c.relname, coalesce((
            SELECT (v.freq * greatest(t.reltuples, 0))::bigint
            FROM pg_stats s JOIN pg_class t ON t.oid = 'fragments'::regclass,
                 unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(kind, freq)
            WHERE s.schemaname = 'agent_memory' AND s.tablename = 'fragments' AND s.attname = 'type'
              AND v.kind = substr(c.relname, length('fragments_embedding_hnsw_') + 1)
        ), 0) AS n
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'fragments'::regclass AND c.relname LIKE 'fragments\_embedding\_hnsw\_%'
    LOOP
        IF graph.n < 100000 THEN
            EXECUTE format('DROP INDEX IF EXISTS %I', graph.relname);
        END IF;
    END LOOP;
END
$$;
