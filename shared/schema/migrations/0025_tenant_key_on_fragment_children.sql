-- Every row a fragment owns carries its tenant (key_id), the shape a store distributed by
-- key_id needs (deploy/CAPACITY.md: Citus with key_id as the distribution column, every
-- tenant table co-located with fragments, so a row and its children live on one shard).
--
-- fragment_passages, fragment_versions, mnemory_memories, fragment_link_pending and
-- passage_backfill had only fragment_id. They get key_id, with the same meaning as
-- fragments.key_id (NULL = the master key's own), filled by the INSERT that writes them
-- (shared/repositories: the value is read from the parent in the same statement, no
-- per-row trigger on the ingest path; fragment_link_pending's existing statement trigger
-- copies it from the inserted fragments), and backfilled here from the parent.
--
-- A child's key_id must equal its fragment's: a foreign key on (fragment_id, key_id)
-- against fragments (id, key_id) refuses a row that names another tenant, and ON UPDATE
-- CASCADE carries the one change fragments.key_id ever gets (a deleted key's fragments
-- go to the master's own: api_keys ON DELETE SET NULL) to every child. MATCH SIMPLE skips
-- rows whose key_id is NULL, so the single-column foreign keys stay: they still delete the
-- master's children with their fragment. fragment_artifacts already had key_id (the
-- memory's tenant); rows left behind by a deleted key are brought in line first.
--
-- On an existing store the backfill rewrites every child row of a keyed fragment (passages
-- carry a 1.5 KB vector): run it in a quiet window on a large store (deploy/CAPACITY.md).
SET search_path = agent_memory, public;

-- The target of the composite foreign keys; fragments' primary key stays (id) until the
-- master's rows carry a key of their own (deploy/CAPACITY.md, "What changes").
CREATE UNIQUE INDEX IF NOT EXISTS fragments_id_key_id ON fragments (id, key_id);

ALTER TABLE fragment_passages ADD COLUMN IF NOT EXISTS key_id text;
ALTER TABLE fragment_versions ADD COLUMN IF NOT EXISTS key_id text;
ALTER TABLE mnemory_memories ADD COLUMN IF NOT EXISTS key_id text;
ALTER TABLE fragment_link_pending ADD COLUMN IF NOT EXISTS key_id text;
ALTER TABLE passage_backfill ADD COLUMN IF NOT EXISTS key_id text;

-- Only keyed fragments' children change: the master's stay NULL, which is already right.
UPDATE fragment_passages c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND f.key_id IS NOT NULL AND c.key_id IS DISTINCT FROM f.key_id;
UPDATE fragment_versions c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND f.key_id IS NOT NULL AND c.key_id IS DISTINCT FROM f.key_id;
UPDATE mnemory_memories c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND f.key_id IS NOT NULL AND c.key_id IS DISTINCT FROM f.key_id;
UPDATE fragment_link_pending c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND f.key_id IS NOT NULL AND c.key_id IS DISTINCT FROM f.key_id;
UPDATE passage_backfill c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND f.key_id IS NOT NULL AND c.key_id IS DISTINCT FROM f.key_id;
UPDATE fragment_artifacts c SET key_id = f.key_id FROM fragments f
WHERE f.id = c.fragment_id AND c.key_id IS DISTINCT FROM f.key_id;

ALTER TABLE fragment_passages ADD CONSTRAINT fragment_passages_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE fragment_versions ADD CONSTRAINT fragment_versions_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE mnemory_memories ADD CONSTRAINT mnemory_memories_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE fragment_link_pending ADD CONSTRAINT fragment_link_pending_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE passage_backfill ADD CONSTRAINT passage_backfill_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;
ALTER TABLE fragment_artifacts ADD CONSTRAINT fragment_artifacts_fragment_key
    FOREIGN KEY (fragment_id, key_id) REFERENCES fragments (id, key_id) ON UPDATE CASCADE ON DELETE CASCADE;

-- The link queue is written by this statement trigger with every fragment insert.
CREATE OR REPLACE FUNCTION fragment_link_pending_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_memory.fragment_link_pending (fragment_id, created_at, key_id)
    SELECT n.id, n.created_at, n.key_id FROM new_rows n;
    RETURN NULL;
END;
$$;
