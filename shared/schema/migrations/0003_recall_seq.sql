-- Recall, second step (kept apart so databases that already ran 0003_recall get it too).
SET search_path = agent_memory, public;

-- The newest fragment a caller can see (max seq per key): recall's L1 cache and its cached
-- scope counts are valid only while it has not moved.
CREATE INDEX IF NOT EXISTS fragments_key_seq ON fragments (key_id, seq);
CREATE INDEX IF NOT EXISTS fragments_seq ON fragments (seq);
