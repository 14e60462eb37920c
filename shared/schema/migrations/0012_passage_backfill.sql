-- Fragments stored before 0011 have no passage rows (every write since stores them with the
-- fragment). Queue them once; the consolidation stage `passage_backfill` drains the queue in
-- bounded runs. The regex only pre-selects content with two sentence breaks or more (three
-- sentences need two): shared/domain/passages.py decides, and a queued fragment that turns
-- out to be its own only passage just leaves the queue. Fragments without an embedding are
-- not queued: the embedding backfill writes their passages with it.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS passage_backfill (
    fragment_id text PRIMARY KEY REFERENCES fragments (id) ON DELETE CASCADE
);

INSERT INTO passage_backfill (fragment_id)
SELECT f.id FROM fragments f
WHERE f.embedding IS NOT NULL
  AND f.content ~ '[.!?。！？\n].*[.!?。！？\n]'
  AND NOT EXISTS (SELECT 1 FROM fragment_passages p WHERE p.fragment_id = f.id)
ON CONFLICT DO NOTHING;
