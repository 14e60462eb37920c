-- The memory REST API of reference 001 (namespaces = "memory banks", entries) on the one store.
--
-- A namespace is a row here (its description, enabled flag and timestamps, which no fragment
-- column holds); its entries ARE fragments, tied to it by fragments.namespace_id. Every
-- fragment belongs to exactly one namespace: a write that names none (MCP remember,
-- batch_remember, reflect, an admin import) is put in its tenant's oldest namespace whose
-- name is the fragment's topic, created on the spot when there is none. So a fragment
-- remembered over MCP appears in the REST API under the bank named by its topic, and
-- deleting a namespace deletes its fragments (ON DELETE CASCADE), as the reference says.
--
-- No lock is taken for that creation: two writes of a brand new topic racing each other may
-- each create a bank of that name (both valid, both listed; later writes join the oldest).
-- A lock held to the end of the write's transaction would instead let two batches that name
-- the same new topics in opposite orders deadlock.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS memory_namespaces (
    id           uuid PRIMARY KEY,
    -- The tenant, as fragments.key_id: NULL = the master key's own. A deleted key's
    -- namespaces go with its fragments to the master's own (fragments: ON DELETE SET NULL).
    key_id       text REFERENCES api_keys (id) ON DELETE SET NULL,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    enabled      boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_namespaces_key_name ON memory_namespaces (key_id, name, created_at);
CREATE INDEX IF NOT EXISTS memory_namespaces_master_name ON memory_namespaces (name, created_at) WHERE key_id IS NULL;

ALTER TABLE fragments ADD COLUMN IF NOT EXISTS namespace_id uuid REFERENCES memory_namespaces (id) ON DELETE CASCADE;
-- The entry's free-form metadata object (reference 001); NULL for fragments written elsewhere.
ALTER TABLE fragments ADD COLUMN IF NOT EXISTS metadata jsonb;
-- Only namespace_id is indexed: an update of any other column stays HOT-eligible.
CREATE INDEX IF NOT EXISTS fragments_namespace ON fragments (namespace_id);

CREATE OR REPLACE FUNCTION memory_namespace_of_topic() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    found uuid;
BEGIN
    IF NEW.namespace_id IS NOT NULL THEN
        RETURN NEW;
    END IF;
    IF NEW.key_id IS NULL THEN
        SELECT n.id INTO found FROM agent_memory.memory_namespaces n
        WHERE n.key_id IS NULL AND n.name = NEW.topic ORDER BY n.created_at, n.id LIMIT 1;
    ELSE
        SELECT n.id INTO found FROM agent_memory.memory_namespaces n
        WHERE n.key_id = NEW.key_id AND n.name = NEW.topic ORDER BY n.created_at, n.id LIMIT 1;
    END IF;
    IF found IS NULL THEN
        found := gen_random_uuid();
        INSERT INTO agent_memory.memory_namespaces (id, key_id, name, created_at, updated_at)
        VALUES (found, NEW.key_id, NEW.topic, now(), now());
    END IF;
    NEW.namespace_id := found;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS memory_namespace_of_topic ON fragments;
CREATE TRIGGER memory_namespace_of_topic
    BEFORE INSERT ON fragments
    FOR EACH ROW EXECUTE FUNCTION memory_namespace_of_topic();

-- Fragments stored before this migration: one namespace per tenant and topic.
INSERT INTO memory_namespaces (id, key_id, name, created_at, updated_at)
SELECT gen_random_uuid(), t.key_id, t.topic, t.first_at, t.last_at
FROM (
    SELECT key_id, topic, min(created_at) AS first_at, max(updated_at) AS last_at
    FROM fragments WHERE namespace_id IS NULL GROUP BY key_id, topic
) t;
UPDATE fragments f SET namespace_id = n.id
FROM memory_namespaces n
WHERE f.namespace_id IS NULL AND n.name = f.topic AND n.key_id IS NOT DISTINCT FROM f.key_id;
