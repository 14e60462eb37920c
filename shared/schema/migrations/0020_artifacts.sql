-- Artifacts (reference 004: /api/memories/{id}/artifacts): the bytes live outside Postgres
-- (local disk or an S3-compatible store, shared/artifacts/); a row here says where, whose and
-- what. Deleting the memory deletes its rows (ON DELETE CASCADE, whatever deleted it: forget,
-- the 004 DELETE, a key's removal), and the trigger queues each row's stored object in
-- artifact_purge_queue in the same transaction; ingest deletes queued objects after the
-- commit (services/ingest/artifacts.py), so no object outlives its memory by more than
-- the next purge, even when storage is down at the moment of the delete.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS fragment_artifacts (
    id            text PRIMARY KEY,
    fragment_id   text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    -- The memory's tenant (its key; NULL for the master key's own), read through scope_clause.
    key_id        text,
    filename      text NOT NULL,
    content_type  text NOT NULL,
    size          bigint NOT NULL CHECK (size >= 0),
    sha256        text NOT NULL,
    backend       text NOT NULL CHECK (backend IN ('disk', 's3')),
    storage_key   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS fragment_artifacts_fragment ON fragment_artifacts (fragment_id, created_at);

CREATE TABLE IF NOT EXISTS artifact_purge_queue (
    backend      text NOT NULL,
    storage_key  text NOT NULL,
    queued_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (backend, storage_key)
);

CREATE OR REPLACE FUNCTION queue_artifact_purge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO artifact_purge_queue (backend, storage_key) VALUES (OLD.backend, OLD.storage_key)
    ON CONFLICT DO NOTHING;
    RETURN OLD;
END;
$$;

DROP TRIGGER IF EXISTS fragment_artifacts_purge ON fragment_artifacts;
CREATE TRIGGER fragment_artifacts_purge AFTER DELETE ON fragment_artifacts
    FOR EACH ROW EXECUTE FUNCTION queue_artifact_purge();
