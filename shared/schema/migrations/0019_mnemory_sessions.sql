-- Session summaries of the mnemory REST surface (reference 004: /api/sessions), written by
-- the worker's /api/remember job, and the remember requests it has finished (a redelivered
-- job after a worker crash stores nothing twice).
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS mnemory_session_summaries (
    id                       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- NULL = the master key's own sessions.
    key_id                   text REFERENCES api_keys (id) ON DELETE CASCADE,
    session_id               text NOT NULL,
    agent_id                 text,
    summary                  text NOT NULL DEFAULT '',
    memory_ids               text[] NOT NULL DEFAULT '{}',
    consolidation_state      text NOT NULL DEFAULT 'idle'
                             CHECK (consolidation_state IN ('idle', 'consolidating', 'consolidated', 'failed')),
    consolidated_memory_ids  text[] NOT NULL DEFAULT '{}',
    consolidated_at          timestamptz,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);

-- One summary per session id per tenant ('' stands for the master key).
CREATE UNIQUE INDEX IF NOT EXISTS mnemory_session_summaries_tenant_session
    ON mnemory_session_summaries ((coalesce(key_id, '')), session_id);
CREATE INDEX IF NOT EXISTS mnemory_session_summaries_updated ON mnemory_session_summaries (key_id, updated_at DESC);

CREATE TABLE IF NOT EXISTS mnemory_remember_requests (
    request_id   text PRIMARY KEY,
    key_id       text REFERENCES api_keys (id) ON DELETE CASCADE,
    memory_ids   text[] NOT NULL DEFAULT '{}',
    done_at      timestamptz NOT NULL DEFAULT now()
);
