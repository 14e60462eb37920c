-- Consolidation compares only fragments newer than their group's mark. A mark per
-- (key, workspace, topic) group replaces stamping every fragment (fragments.consolidated_at
-- stays unused): rewriting a ~2 KB row with a vector is rarely a HOT update, and a non-HOT
-- one costs an HNSW insert (measured ~1-3 ms a row on 2 cores), which made the stamp the
-- most expensive step of a cycle at 100k fragments.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS consolidation_marks (
    key_id     text NOT NULL,           -- '' = the master key's own fragments
    workspace  text NOT NULL,           -- '' = no workspace
    topic      text NOT NULL,
    upto       timestamptz NOT NULL,
    PRIMARY KEY (key_id, workspace, topic)
);
