-- The admin console's time windows over every tenant (/stats, /memory/search-events?days=,
-- searchMetrics' latest 100 recalls). The existing indexes lead with key_id, so a window over
-- all keys read the whole table, and search_events is never pruned: the latest-100 sample
-- sorted the table on every /stats. With these it is an index range (or a backward scan).
SET search_path = agent_memory, public;

CREATE INDEX IF NOT EXISTS search_events_created ON search_events (created_at);
CREATE INDEX IF NOT EXISTS tool_feedback_created ON tool_feedback (created_at);
