-- Engram schema v1. Every field the reference's tools read or write.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE SCHEMA IF NOT EXISTS agent_memory;
SET search_path = agent_memory, public;

CREATE TABLE api_keys (
    id                  text PRIMARY KEY,
    name                text NOT NULL,
    key_hash            text NOT NULL UNIQUE,
    key_prefix          text NOT NULL,
    status              text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    permissions         text[] NOT NULL DEFAULT ARRAY['read', 'write'],
    default_workspace   text,
    allowed_workspaces  text[],
    default_mode        text,
    daily_limit         integer,
    fragment_limit      integer,
    symbolic_hard_gate  boolean NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_used_at        timestamptz
);

CREATE TABLE key_groups (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    description text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE key_group_members (
    group_id   text NOT NULL REFERENCES key_groups (id) ON DELETE CASCADE,
    key_id     text NOT NULL REFERENCES api_keys (id) ON DELETE CASCADE,
    joined_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, key_id)
);
CREATE INDEX key_group_members_key ON key_group_members (key_id);

CREATE TABLE fragments (
    id                 text PRIMARY KEY,
    content            text NOT NULL,
    topic              text NOT NULL,
    type               text NOT NULL CHECK (type IN ('fact', 'decision', 'error', 'preference', 'procedure', 'relation', 'episode')),
    keywords           text[] NOT NULL DEFAULT '{}',
    importance         real NOT NULL DEFAULT 0.5 CHECK (importance >= 0 AND importance <= 1),
    source             text,
    scope              text NOT NULL DEFAULT 'permanent' CHECK (scope IN ('permanent', 'session')),
    is_anchor          boolean NOT NULL DEFAULT false,
    valid_from         timestamptz NOT NULL DEFAULT now(),
    valid_to           timestamptz,
    superseded_by      text,
    ttl_tier           text NOT NULL DEFAULT 'warm' CHECK (ttl_tier IN ('hot', 'warm', 'cold', 'permanent')),
    ema_activation     real NOT NULL DEFAULT 0,
    access_count       integer NOT NULL DEFAULT 0,
    last_accessed_at   timestamptz,
    last_decay_at      timestamptz,
    -- NULL = the master key's own fragments.
    key_id             text REFERENCES api_keys (id) ON DELETE SET NULL,
    workspace          text,
    workspace_source   text NOT NULL DEFAULT 'unscoped' CHECK (workspace_source IN ('explicit', 'key_default', 'unscoped')),
    agent_id           text NOT NULL DEFAULT 'default',
    session_id         text,
    case_id            text,
    goal               text,
    outcome            text,
    phase              text,
    resolution_status  text CHECK (resolution_status IN ('open', 'resolved', 'abandoned')),
    assertion_status   text NOT NULL DEFAULT 'observed' CHECK (assertion_status IN ('observed', 'inferred', 'verified', 'rejected')),
    affect             text NOT NULL DEFAULT 'neutral' CHECK (affect IN ('neutral', 'frustration', 'confidence', 'surprise', 'doubt', 'satisfaction')),
    context_summary    text,
    content_hash       text NOT NULL,
    embedding          vector(384),
    -- Written by the repository from content + topic + keywords (English stemming for
    -- prose, 'simple' for keywords) so the analyser can change without a table rewrite.
    search_tsv         tsvector NOT NULL DEFAULT ''::tsvector,
    auto_linked_at     timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Vector search over the whole store; tenant filters run inside the scan (iterative scan).
CREATE INDEX fragments_embedding_hnsw ON fragments USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
CREATE INDEX fragments_keywords_gin ON fragments USING gin (keywords);
CREATE INDEX fragments_tsv_gin ON fragments USING gin (search_tsv);
-- Topic lookups (topic_mismatch hint, search_traces ILIKE) are where trigram pays; content is not.
CREATE INDEX fragments_topic_trgm ON fragments USING gin (topic gin_trgm_ops);
CREATE INDEX fragments_key_ws ON fragments (key_id, workspace);
CREATE INDEX fragments_key_topic ON fragments (key_id, topic);
CREATE INDEX fragments_session ON fragments (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX fragments_case ON fragments (case_id) WHERE case_id IS NOT NULL;
CREATE INDEX fragments_hash ON fragments (key_id, content_hash);
CREATE INDEX fragments_created ON fragments (created_at);
CREATE INDEX fragments_unlinked ON fragments (created_at) WHERE auto_linked_at IS NULL;

CREATE TABLE fragment_links (
    from_id        text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    to_id          text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    relation_type  text NOT NULL CHECK (relation_type IN ('related', 'caused_by', 'resolved_by', 'part_of', 'contradicts', 'superseded_by', 'co_retrieved', 'temporal')),
    weight         real NOT NULL DEFAULT 1 CHECK (weight >= 0 AND weight <= 1),
    key_id         text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (from_id, to_id, relation_type),
    CHECK (from_id <> to_id)
);
CREATE INDEX fragment_links_to ON fragment_links (to_id);

CREATE TABLE fragment_versions (
    id            bigserial PRIMARY KEY,
    fragment_id   text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    version       integer NOT NULL,
    content       text NOT NULL,
    topic         text NOT NULL,
    type          text NOT NULL,
    keywords      text[] NOT NULL DEFAULT '{}',
    importance    real NOT NULL,
    snapshot      jsonb NOT NULL DEFAULT '{}',
    changed_by    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (fragment_id, version)
);

CREATE TABLE sessions (
    id                text PRIMARY KEY,
    transport_id      text,
    key_id            text,
    workspace         text,
    mode              text,
    seq               integer NOT NULL DEFAULT 0,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_activity_at  timestamptz NOT NULL DEFAULT now(),
    ended_at          timestamptz,
    end_reason        text,
    reflected_at      timestamptz,
    activity          jsonb NOT NULL DEFAULT '[]'
);
CREATE INDEX sessions_key ON sessions (key_id);
CREATE INDEX sessions_unreflected ON sessions (ended_at) WHERE reflected_at IS NULL;

CREATE TABLE search_events (
    id             bigserial PRIMARY KEY,
    key_id         text,
    session_id     text,
    query_type     text NOT NULL,
    query_text     text,
    keywords       text[],
    filters        jsonb NOT NULL DEFAULT '{}',
    result_ids     text[] NOT NULL DEFAULT '{}',
    result_count   integer NOT NULL DEFAULT 0,
    search_path    text,
    latency_ms     real,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX search_events_key_time ON search_events (key_id, created_at);

CREATE TABLE tool_feedback (
    id                  bigserial PRIMARY KEY,
    key_id              text,
    tool_name           text NOT NULL,
    relevant            boolean NOT NULL,
    sufficient          boolean NOT NULL,
    suggestion          text,
    context             text,
    session_id          text,
    trigger_type        text NOT NULL DEFAULT 'voluntary' CHECK (trigger_type IN ('sampled', 'voluntary')),
    irrelevance_reason  text CHECK (irrelevance_reason IN ('not_stored', 'search_miss', 'scope_leak', 'topic_mismatch', 'other')),
    search_event_id     bigint REFERENCES search_events (id) ON DELETE SET NULL,
    fragment_ids        text[],
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE task_feedback (
    id                  bigserial PRIMARY KEY,
    key_id              text,
    session_id          text,
    overall_success     boolean,
    outcome             text CHECK (outcome IN ('completed', 'partial', 'blocked', 'abandoned', 'unknown')),
    evaluator           text CHECK (evaluator IN ('agent', 'automatic', 'human')),
    evidence            text,
    unmet_requirements  text[],
    tool_highlights     text[],
    tool_pain_points    text[],
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE case_events (
    id            bigserial PRIMARY KEY,
    case_id       text NOT NULL,
    key_id        text,
    fragment_id   text REFERENCES fragments (id) ON DELETE SET NULL,
    event_type    text NOT NULL CHECK (event_type IN ('milestone_reached', 'hypothesis_proposed', 'hypothesis_rejected', 'decision_committed', 'error_observed', 'fix_attempted', 'verification_passed', 'verification_failed', 'case_closed')),
    summary       text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX case_events_case ON case_events (case_id);

CREATE TABLE idempotency_records (
    key_id           text NOT NULL DEFAULT '',
    idempotency_key  text NOT NULL CHECK (length(idempotency_key) <= 128),
    fragment_id      text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, idempotency_key)
);

CREATE TABLE maintenance_runs (
    id           bigserial PRIMARY KEY,
    job          text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    status       text NOT NULL DEFAULT 'running',
    error        text,
    result       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX maintenance_runs_job ON maintenance_runs (job, started_at DESC);
