-- The memory REST API's consolidation status (reference 001: GET /memory/consolidation/status
-- reports lastRunAt, lastAttemptAt and lastError without a model, so an unattended server
-- shows that maintenance is failing without anyone reading logs). One row per tenant: ''
-- is the master key's own store, else the key id. lastAttemptAt moves on every pass;
-- lastRunAt only when the LLM step ran.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS memory_consolidation_status (
    tenant           text PRIMARY KEY,
    last_run_at      timestamptz,
    last_attempt_at  timestamptz,
    last_error       text
);
