-- Maintenance: marks that keep consolidation and fsck incremental and idempotent, the
-- run table's tenant/progress fields, fsck issues kept for review, AutoReflect attempts.
SET search_path = agent_memory, public;

ALTER TABLE fragments ADD COLUMN IF NOT EXISTS activation_decayed_at timestamptz;
-- Set when dedup/contradiction stages compared the fragment with its tenant+topic group:
-- later cycles compare only new fragments against their group.
ALTER TABLE fragments ADD COLUMN IF NOT EXISTS consolidated_at timestamptz;
-- fsck incremental mode: fragments changed since their last check.
ALTER TABLE fragments ADD COLUMN IF NOT EXISTS checked_at timestamptz;
-- Maintenance rewrites importance, tier and activation of many rows per cycle. With free
-- space on each page those updates stay HOT (no new HNSW / GIN entries); at the default
-- fillfactor 100 each one re-inserts into every index (~1 ms per row with HNSW). None of
-- the columns above may be indexed for the same reason.
ALTER TABLE fragments SET (fillfactor = 80);
CREATE INDEX IF NOT EXISTS fragments_embedding_missing ON fragments (created_at) WHERE embedding IS NULL;

ALTER TABLE maintenance_runs ADD COLUMN IF NOT EXISTS tenant text NOT NULL DEFAULT 'all';
ALTER TABLE maintenance_runs ADD COLUMN IF NOT EXISTS params jsonb NOT NULL DEFAULT '{}';
ALTER TABLE maintenance_runs ADD COLUMN IF NOT EXISTS progress jsonb NOT NULL DEFAULT '{}';

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS reflect_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS reflect_error text;

CREATE TABLE IF NOT EXISTS fsck_issues (
    id            bigserial PRIMARY KEY,
    run_id        bigint NOT NULL REFERENCES maintenance_runs (id) ON DELETE CASCADE,
    key_id        text,
    issue_type    text NOT NULL CHECK (issue_type IN ('duplicate', 'contradiction', 'quality', 'reclassify', 'security')),
    severity      text NOT NULL CHECK (severity IN ('low', 'medium', 'high')),
    confidence    real NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    fragment_ids  text[] NOT NULL,
    reason        text NOT NULL,
    -- The fix: a list of {"action": "delete" | "update" | "supersede", "id": ..., ...}.
    actions       jsonb NOT NULL DEFAULT '[]',
    status        text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'applied', 'skipped', 'failed')),
    applied_at    timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS fsck_issues_run ON fsck_issues (run_id);
