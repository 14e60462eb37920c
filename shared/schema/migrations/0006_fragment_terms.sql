-- Recall's lexical layer as an inverted index: one narrow row per (fragment, lexeme).
--
-- Ranking BM25 straight off fragments.search_tsv visits every matching heap row (wide rows:
-- the 384-d embedding lives there), about 3 µs a row; a common word in a 100k store matches
-- thousands. Postings carry what BM25 and the tenant / workspace / type filters need, so
-- candidate generation and document frequencies are index-only scans over short, sorted
-- runs, and only the best few hundred candidates are joined back to fragments.
--
-- A trigger keeps the postings equal to search_tsv on every write path (insert, amend's
-- refresh, fsck, imports, bulk loads); ON DELETE CASCADE follows deletions.
SET search_path = agent_memory, public;

CREATE TABLE IF NOT EXISTS fragment_terms (
    fragment_id text NOT NULL REFERENCES fragments (id) ON DELETE CASCADE,
    term        text NOT NULL,
    key_id      text,
    workspace   text,
    type        text NOT NULL,
    tf          integer NOT NULL,   -- positions of the lexeme in search_tsv (at least 1)
    dl          integer NOT NULL,   -- distinct lexemes of the fragment (length(search_tsv))
    PRIMARY KEY (fragment_id, term)
);

CREATE INDEX IF NOT EXISTS fragment_terms_lookup
    ON fragment_terms (term, key_id, workspace, type) INCLUDE (fragment_id, tf, dl);

-- Index-only scans need the visibility map: vacuum this table early after bulk inserts.
ALTER TABLE fragment_terms SET (autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_scale_factor = 0.05);

-- Inserts: one statement-level pass over the transition table (a multi-row insert of a
-- batch writes its postings in one INSERT ... SELECT).
CREATE OR REPLACE FUNCTION fragment_terms_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_memory.fragment_terms (fragment_id, term, key_id, workspace, type, tf, dl)
    SELECT n.id, u.lexeme, n.key_id, n.workspace, n.type,
           greatest(coalesce(cardinality(u.positions), 1), 1), length(n.search_tsv)
    FROM new_rows n, unnest(n.search_tsv) AS u;
    RETURN NULL;
END;
$$;

-- Updates of what the postings carry: rewrite that fragment's postings.
CREATE OR REPLACE FUNCTION fragment_terms_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.search_tsv IS NOT DISTINCT FROM OLD.search_tsv AND NEW.key_id IS NOT DISTINCT FROM OLD.key_id
       AND NEW.workspace IS NOT DISTINCT FROM OLD.workspace AND NEW.type IS NOT DISTINCT FROM OLD.type THEN
        RETURN NULL;
    END IF;
    DELETE FROM agent_memory.fragment_terms WHERE fragment_id = NEW.id;
    INSERT INTO agent_memory.fragment_terms (fragment_id, term, key_id, workspace, type, tf, dl)
    SELECT NEW.id, u.lexeme, NEW.key_id, NEW.workspace, NEW.type,
           greatest(coalesce(cardinality(u.positions), 1), 1), length(NEW.search_tsv)
    FROM unnest(NEW.search_tsv) AS u;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS fragment_terms_insert ON fragments;
CREATE TRIGGER fragment_terms_insert
    AFTER INSERT ON fragments REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION fragment_terms_insert();

DROP TRIGGER IF EXISTS fragment_terms_update ON fragments;
CREATE TRIGGER fragment_terms_update
    AFTER UPDATE OF search_tsv, key_id, workspace, type ON fragments
    FOR EACH ROW EXECUTE FUNCTION fragment_terms_update();

-- Fragments stored before this migration.
INSERT INTO fragment_terms (fragment_id, term, key_id, workspace, type, tf, dl)
SELECT f.id, u.lexeme, f.key_id, f.workspace, f.type,
       greatest(coalesce(cardinality(u.positions), 1), 1), length(f.search_tsv)
FROM fragments f, unnest(f.search_tsv) AS u
ON CONFLICT DO NOTHING;

-- Vector search over a small filtered scope (a workspace, a key's own fragments, a type)
-- is exact instead of walking the HNSW graph for the few rows that pass: this index finds
-- the scope of a master-key query by workspace (API keys have fragments_key_ws).
CREATE INDEX IF NOT EXISTS fragments_workspace_type ON fragments (workspace, type);

-- Keep the 1.5 KB embedding in the row: stored out of line (the default once a row passes
-- 2 KB) every cosine of a candidate, the exact scan above and score_ids paid a TOAST lookup.
-- Rows written from now on; older rows move on their next rewrite.
ALTER TABLE fragments ALTER COLUMN embedding SET STORAGE MAIN;
ALTER TABLE fragments SET (toast_tuple_target = 4080);

-- Fresh statistics soon after a bulk write: until ANALYZE has seen the rows, recall's
-- planner works from a near-empty table's estimates (a first batch of a few hundred
-- fragments made every recall ~3x slower until autovacuum came round).
ALTER TABLE fragments SET (autovacuum_analyze_threshold = 100, autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE fragment_terms SET (autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0.05);
