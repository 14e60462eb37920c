-- What each version of the vector cells was trained on, so the worker can train them again as
-- the store grows.
--
-- Centroids trained on the store at VECTOR_CELLS_MIN_ROWS (200k) describe the tenants and
-- topics it had then; rows written since are filed under the nearest of those centroids
-- whatever their own distribution, and a cell that gathers too many makes every query that
-- probes it read them all. The worker builds a new version beside the current one once the
-- table has VECTOR_CELLS_RETRAIN_GROWTH times the rows a version was trained at, and retires
-- the old one a run later (recall learns the new version within a minute).
--
-- A version built before this migration is taken as trained at the table's present size.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS vector_cell_versions (
    version      integer PRIMARY KEY,
    trained_rows bigint NOT NULL,
    built_at     timestamptz NOT NULL DEFAULT now()
);

INSERT INTO vector_cell_versions (version, trained_rows)
SELECT DISTINCT v.version, greatest(c.reltuples, 0)::bigint
FROM vector_cells v JOIN pg_class c ON c.oid = 'fragments'::regclass
ON CONFLICT (version) DO NOTHING;
