-- K-means centroids for the cells index (shared/repositories/vector_cells.py).
--
-- A version's centroids are written once, with its function fragment_cell_v<N> and its index
-- fragments_cells_v<N>, by the maintenance worker once the store is large enough; an index
-- expression must be IMMUTABLE, so the rows of a version are never updated (the trigger below)
-- and a version is only ever dropped whole, its index first. Not tenant-owned: every tenant's
-- rows are placed by the same centroids, as they are walked through the same HNSW graphs.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS vector_cells (
    version  integer NOT NULL,
    cell     integer NOT NULL,
    centroid halfvec(384) NOT NULL,
    PRIMARY KEY (version, cell)
);

-- Versions are never reused: a recall process that still knows a retired version must find
-- its function gone (and rank without cells), not a newer version's under its name whose
-- index may still be building.
CREATE SEQUENCE IF NOT EXISTS vector_cells_version;

CREATE OR REPLACE FUNCTION vector_cells_write_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'vector_cells rows are written once: a new version replaces them'
        USING ERRCODE = 'restrict_violation';
END
$$;

DROP TRIGGER IF EXISTS vector_cells_write_once ON vector_cells;
CREATE TRIGGER vector_cells_write_once BEFORE UPDATE ON vector_cells
    FOR EACH ROW EXECUTE FUNCTION vector_cells_write_once();
