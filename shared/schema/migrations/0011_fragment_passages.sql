-- Passage embeddings: one row per sentence of a multi-sentence fragment (see
-- shared/domain/passages.py). Recall reads them only for the fragments it has already pooled
-- through the caller's scope (by fragment_id, the primary key's prefix); there is no vector
-- index on them, they are not a candidate layer. A single-sentence fragment has none: its
-- own embedding is its only passage. Written with the fragment (same statement batch) and
-- replaced whenever its embedding is.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS fragment_passages (
    fragment_id text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    ordinal     smallint NOT NULL,
    embedding   vector(384) NOT NULL,
    PRIMARY KEY (fragment_id, ordinal)
);
