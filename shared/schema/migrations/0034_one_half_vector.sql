-- A fragment's embedding is stored once, in half precision.
--
-- Since 0027 every row carried its embedding twice: the float vector (1,536 bytes) and the
-- half vector generated from it (768 bytes) for the covering index. Rows were ~3.2 KB, of
-- which 2.3 KB the two vectors, and at fillfactor 65 (0029) a row that size is alone on its
-- page: at 1M fragments the heap was 7.9 GB for 3.2 GB of rows, and the whole database
-- (~21 GB) no longer fit beside shared buffers in this machine's 24 GB, so filtered recalls
-- read pages from disk (bench/README.md, sessions 40-41). The float vector's precision bought
-- nothing a caller sees: the exact ranking and the cells already rank by the half vector, and
-- half against float orders kept the same top 10, 30 and 60 ids with cosines within 6e-5
-- (session 27). Rows of ~1.6-1.9 KB (the bench's, a short fact's) are two or three to a page
-- at fillfactor 65, each with its next version's room (0029's rule: a row no larger than the
-- page's reserve leaves it), and the HNSW graphs hold half vectors too.
--
-- What changes for callers: nothing on the wire. Vectors are still bound as float `vector`
-- (pgvector's implicit cast narrows them on the way in); statements that read an embedding
-- back cast it to `vector`. Similarities are computed in half precision (differences in the
-- fourth decimal).
--
-- Cost: the table is rewritten and its indexes rebuilt under the write lock, the HNSW graph
-- among them (at 1M: minutes). The covering index and the cells indexes depended on the
-- generated column and go with it; the covering index is built again here, the cells by the
-- maintenance worker (vector_cells retires a version whose index is gone), the type graphs
-- likewise once a type is large enough (type_graphs).
SET search_path = agent_memory, public;

DROP INDEX IF EXISTS fragments_embedding_hnsw;
DO $$
DECLARE
    graph record;
BEGIN
    FOR graph IN
        SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'fragments'::regclass AND c.relname LIKE 'fragments\_embedding\_hnsw\_%'
    LOOP
        EXECUTE format('DROP INDEX IF EXISTS %I', graph.relname);
    END LOOP;
END
$$;

ALTER TABLE fragments DROP COLUMN IF EXISTS embedding_half;
ALTER TABLE fragments ALTER COLUMN embedding TYPE halfvec(384) USING embedding::halfvec(384);
-- 0006's reason holds: a row is read for its vector, never through TOAST.
ALTER TABLE fragments ALTER COLUMN embedding SET STORAGE MAIN;

CREATE INDEX IF NOT EXISTS fragments_scope_vectors ON fragments (key_id, workspace, type, importance)
    INCLUDE (valid_to, scope, session_id, id, embedding);
CREATE INDEX IF NOT EXISTS fragments_embedding_hnsw ON fragments USING hnsw (embedding halfvec_cosine_ops)
    WITH (m = 16, ef_construction = 64);
