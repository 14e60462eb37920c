-- The transactional outbox of background jobs (shared/jobs.py, shared/job_relay.py).
--
-- A write inserts its jobs here in its own transaction, so a job exists exactly when the
-- write committed, and no broker round trip sits inside the request: with Redis down or
-- hung a write used to wait out the broker's connect timeouts (~6 s). A relay in each
-- ingest process (and beat's maintenance.outbox_relay) sends the rows to Celery and
-- deletes them; rows are claimed FOR UPDATE SKIP LOCKED, so relays never send a row twice
-- at once. A row sent but not yet deleted when a relay dies is sent again: every task is
-- idempotent (services/maintenance/tasks.py). `broker` names the broker the writer used (a
-- hash of its URL): a relay takes only its own broker's rows, so deployments (or test
-- stacks) that share a database but not a Redis never send each other's jobs.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS job_outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    broker     text        NOT NULL,
    task       text        NOT NULL,
    queue      text        NOT NULL,
    kwargs     jsonb       NOT NULL,
    -- Trace context of the request that made the job, so one trace spans ingest -> worker.
    headers    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS job_outbox_broker ON job_outbox (broker, id);
