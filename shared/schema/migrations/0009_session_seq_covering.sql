-- Neighbouring turns without reading the turns that are not neighbours.
--
-- Recall looks at the 8 turns of a session either side of each of ~60 candidates and keeps
-- those in the candidate's topic. With (session_id, seq) alone, each of those ~960 turns was
-- a heap fetch of a wide row (the embedding lives there) just to read its topic: 2.3-3.6 ms a
-- recall at 100k, where sessions interleave topics and few of them match. Carrying topic and
-- id in the index makes that look an index-only scan; only the matches are fetched (1.9 ms,
-- most of it the candidates' own rows). Same key, so it replaces the old index.
SET search_path = agent_memory, public;

CREATE INDEX IF NOT EXISTS fragments_session_seq_topic ON fragments (session_id, seq) INCLUDE (topic, id)
    WHERE session_id IS NOT NULL;
DROP INDEX IF EXISTS fragments_session_seq;
