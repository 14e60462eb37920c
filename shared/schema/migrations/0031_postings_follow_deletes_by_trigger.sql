-- Postings follow their fragment's deletion by a statement trigger instead of a foreign key.
--
-- fragment_terms is written only by fragments' own triggers (0006), from the rows just inserted
-- or updated, so its foreign key to fragments could never refuse a row; what it cost was an RI
-- lookup of fragments for every posting inserted (20-40 a conversation turn). What it did was
-- ON DELETE CASCADE, which fragment_terms_delete does once per statement, and the postings'
-- tenant (key_id) already follows its fragment through fragment_terms_update. A TRUNCATE of
-- fragments empties the postings too (the foreign key made a TRUNCATE without CASCADE fail).
SET search_path = agent_memory, public;

CREATE OR REPLACE FUNCTION fragment_terms_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agent_memory.fragment_terms t USING old_rows o WHERE t.fragment_id = o.id;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS fragment_terms_delete ON fragments;
CREATE TRIGGER fragment_terms_delete
    AFTER DELETE ON fragments REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION fragment_terms_delete();

CREATE OR REPLACE FUNCTION fragment_terms_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE agent_memory.fragment_terms;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS fragment_terms_truncate ON fragments;
CREATE TRIGGER fragment_terms_truncate
    AFTER TRUNCATE ON fragments
    FOR EACH STATEMENT EXECUTE FUNCTION fragment_terms_truncate();

ALTER TABLE fragment_terms DROP CONSTRAINT IF EXISTS fragment_terms_fragment_id_fkey;
