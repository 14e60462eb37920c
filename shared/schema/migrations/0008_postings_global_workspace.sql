-- Postings of global fragments (workspace NULL) carry workspace '' instead of NULL.
--
-- Recall's workspace scope is "that workspace or global". On fragment_terms written as
-- `workspace = $1 OR workspace IS NULL` the OR kept the workspace out of the lookup index's
-- conditions: every posting of a term, in every workspace, was read and filtered (21 terms of
-- a 5-workspace 100k store: 16-25 ms to count). `workspace = ANY(ARRAY[$1, ''])` is an index
-- condition (5-6 ms for the same counts). Only the postings change; fragments keep NULL.
SET search_path = agent_memory, public;

UPDATE fragment_terms SET workspace = '' WHERE workspace IS NULL;
ALTER TABLE fragment_terms ALTER COLUMN workspace SET NOT NULL;

CREATE OR REPLACE FUNCTION fragment_terms_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_memory.fragment_terms (fragment_id, term, key_id, workspace, type, tf, dl)
    SELECT n.id, u.lexeme, n.key_id, coalesce(n.workspace, ''), n.type,
           greatest(coalesce(cardinality(u.positions), 1), 1), length(n.search_tsv)
    FROM new_rows n, unnest(n.search_tsv) AS u;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION fragment_terms_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.search_tsv IS NOT DISTINCT FROM OLD.search_tsv AND NEW.key_id IS NOT DISTINCT FROM OLD.key_id
       AND NEW.workspace IS NOT DISTINCT FROM OLD.workspace AND NEW.type IS NOT DISTINCT FROM OLD.type THEN
        RETURN NULL;
    END IF;
    DELETE FROM agent_memory.fragment_terms WHERE fragment_id = NEW.id;
    INSERT INTO agent_memory.fragment_terms (fragment_id, term, key_id, workspace, type, tf, dl)
    SELECT NEW.id, u.lexeme, NEW.key_id, coalesce(NEW.workspace, ''), NEW.type,
           greatest(coalesce(cardinality(u.positions), 1), 1), length(NEW.search_tsv)
    FROM unnest(NEW.search_tsv) AS u;
    RETURN NULL;
END;
$$;
