-- Fragments waiting for their automatic links, in a table of their own.
--
-- Marking a fragment linked used to be `UPDATE fragments SET auto_linked_at = now()`. That
-- column sat in a partial index's predicate, so the update could never be HOT: every write
-- stored each fragment twice and re-inserted the second copy into all of fragments' indexes,
-- the HNSW graph included (~0.45 ms a fragment at 60k rows, a third of Postgres's share of a
-- write), and left a dead copy behind for vacuum to take out of that graph again. A row
-- here is inserted with the fragment (one statement per insert, whatever the write path) and
-- deleted when its links are made; the sweep reads this table instead of scanning fragments.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS fragment_link_pending (
    fragment_id text PRIMARY KEY REFERENCES fragments (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO fragment_link_pending (fragment_id, created_at)
SELECT id, created_at FROM fragments WHERE auto_linked_at IS NULL
ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION fragment_link_pending_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_memory.fragment_link_pending (fragment_id, created_at)
    SELECT n.id, n.created_at FROM new_rows n;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS fragment_link_pending_insert ON fragments;
CREATE TRIGGER fragment_link_pending_insert
    AFTER INSERT ON fragments REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION fragment_link_pending_insert();

DROP INDEX IF EXISTS fragments_unlinked;
ALTER TABLE fragments DROP COLUMN IF EXISTS auto_linked_at;
