-- The outbox of memory:* events (reference 001: GET /api/v1/memory/events and /ws;
-- shared/memory_events.py).
--
-- Every write path of the store (MCP remember / batch_remember / amend / forget / reflect,
-- the memory REST API, both imports, consolidation, fsck, whatever comes next) changes
-- fragments and namespaces through SQL, so the events are recorded here, by triggers, in the
-- write's own transaction: an event exists exactly when its write committed, survives a
-- Redis outage or a crash right after the commit, and no write path can forget to publish.
-- A write pays one INSERT per namespace and event type it touched (a 10,000-entry import
-- into one bank records one row, not 10,000: rows are coalesced per transaction) and a
-- NOTIFY that Postgres delivers only at commit. A relay in each ingest process, woken by it,
-- appends the rows to the Redis stream every gateway replica reads and deletes them; rows
-- are claimed FOR UPDATE SKIP LOCKED, so relays never publish a row twice at once (one that
-- dies between XADD and its commit publishes it again: delivery is at least once).
--
-- Recording is on for a connection whose session sets engram.memory_events_sink (ingest's
-- and the worker's pools do when they have Redis): the sink names the Redis stream of the
-- writer's deployment (a hash of its URL and stream key), so deployments or test stacks that
-- share a database but not a Redis never publish each other's events, and a deployment
-- without Redis records nothing that no relay would ever drain.
--
-- What counts as a change, as reference 001 shows an entry: a fragment inserted or deleted,
-- or updated in updated_at (every content-changing write moves it), valid_to (superseded,
-- merged away), namespace_id (moved), content, keywords (tags), metadata or source. Access
-- counts, decay, tiers, embeddings and reference marks change none of these and record
-- nothing. A namespace: inserted, deleted, or its name, description or enabled flag
-- changed (a bank's updated_at moving because its entries changed is entries-changed only).
-- The entries of a namespace deleted with it record no entries-changed: the namespace's
-- namespaces-changed says it.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS memory_event_outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sink       text        NOT NULL,
    type       text        NOT NULL,
    -- The tenant whose memory changed, who may see the event. NULL = the master key's own.
    key_id     text,
    payload    jsonb       NOT NULL,
    -- The recording transaction: one row per (type, tenant, payload) per transaction.
    xact       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS memory_event_outbox_sink ON memory_event_outbox (sink, id);
CREATE UNIQUE INDEX IF NOT EXISTS memory_event_outbox_once
    ON memory_event_outbox (sink, xact, type, key_id, payload) NULLS NOT DISTINCT;

CREATE OR REPLACE FUNCTION memory_events_sink() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('engram.memory_events_sink', true), '')
$$;

-- Statement level, over the inserted or deleted rows (transition table `changed`).
CREATE OR REPLACE FUNCTION memory_events_of_entries() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sink text := agent_memory.memory_events_sink();
BEGIN
    IF sink IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO agent_memory.memory_event_outbox (sink, type, key_id, payload)
    SELECT DISTINCT sink, 'memory:entries-changed', n.key_id, jsonb_build_object('namespaceId', n.id::text)
    FROM changed c JOIN agent_memory.memory_namespaces n ON n.id = c.namespace_id
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('engram_memory_events', sink);
    END IF;
    RETURN NULL;
END;
$$;

-- Row level, only for the updates the trigger's WHEN lets through.
CREATE OR REPLACE FUNCTION memory_events_of_entry_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sink text := agent_memory.memory_events_sink();
BEGIN
    IF sink IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO agent_memory.memory_event_outbox (sink, type, key_id, payload)
    SELECT sink, 'memory:entries-changed', n.key_id, jsonb_build_object('namespaceId', n.id::text)
    FROM agent_memory.memory_namespaces n WHERE n.id IN (OLD.namespace_id, NEW.namespace_id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('engram_memory_events', sink);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION memory_events_of_namespaces() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sink text := agent_memory.memory_events_sink();
BEGIN
    IF sink IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_LEVEL = 'ROW' THEN
        INSERT INTO agent_memory.memory_event_outbox (sink, type, key_id, payload)
        VALUES (sink, 'memory:namespaces-changed', NEW.key_id, jsonb_build_object('namespaceId', NEW.id::text))
        ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO agent_memory.memory_event_outbox (sink, type, key_id, payload)
        SELECT DISTINCT sink, 'memory:namespaces-changed', c.key_id, jsonb_build_object('namespaceId', c.id::text)
        FROM changed c
        ON CONFLICT DO NOTHING;
    END IF;
    IF FOUND THEN
        PERFORM pg_notify('engram_memory_events', sink);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS memory_events_inserted ON fragments;
CREATE TRIGGER memory_events_inserted AFTER INSERT ON fragments
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION memory_events_of_entries();
DROP TRIGGER IF EXISTS memory_events_deleted ON fragments;
CREATE TRIGGER memory_events_deleted AFTER DELETE ON fragments
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION memory_events_of_entries();
DROP TRIGGER IF EXISTS memory_events_updated ON fragments;
CREATE TRIGGER memory_events_updated AFTER UPDATE ON fragments FOR EACH ROW
    WHEN (OLD.updated_at IS DISTINCT FROM NEW.updated_at OR OLD.valid_to IS DISTINCT FROM NEW.valid_to
          OR OLD.namespace_id IS DISTINCT FROM NEW.namespace_id OR OLD.content IS DISTINCT FROM NEW.content
          OR OLD.keywords IS DISTINCT FROM NEW.keywords OR OLD.metadata IS DISTINCT FROM NEW.metadata
          OR OLD.source IS DISTINCT FROM NEW.source)
    EXECUTE FUNCTION memory_events_of_entry_update();

DROP TRIGGER IF EXISTS memory_events_inserted ON memory_namespaces;
CREATE TRIGGER memory_events_inserted AFTER INSERT ON memory_namespaces
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION memory_events_of_namespaces();
DROP TRIGGER IF EXISTS memory_events_deleted ON memory_namespaces;
CREATE TRIGGER memory_events_deleted AFTER DELETE ON memory_namespaces
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION memory_events_of_namespaces();
DROP TRIGGER IF EXISTS memory_events_updated ON memory_namespaces;
CREATE TRIGGER memory_events_updated AFTER UPDATE ON memory_namespaces FOR EACH ROW
    WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.description IS DISTINCT FROM NEW.description
          OR OLD.enabled IS DISTINCT FROM NEW.enabled)
    EXECUTE FUNCTION memory_events_of_namespaces();
