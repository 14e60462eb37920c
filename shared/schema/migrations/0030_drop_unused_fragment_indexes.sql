-- Indexes on fragments that no query can use, dropped: every write paid for them.
--
-- fragments_tsv_gin (search_tsv): the lexical layer reads its postings (fragment_terms, 0006),
-- and the one `@@` left (history.timeline's query) is OR'd with `content ILIKE`, which no index
-- serves, so that OR is a filter over the scope's rows whatever indexes exist.
-- fragments_keywords_gin (keywords): keywords are matched as `$1 = ANY(f.keywords)`, which a GIN
-- index does not serve (only @>, <@, && and = on the whole array do).
-- fragments_session (session_id) WHERE session_id IS NOT NULL: the same rows and the same
-- leading column as fragments_session_seq_topic (0009), which serves every lookup by session.
--
-- What they cost was disk, not the insert's CPU: on a 4k-turn LoCoMo store, 3.2 MB of the
-- fragments' 37 MB of indexes (the tsv GIN alone 2.3 MB, more than the whole HNSW graph);
-- inserting 200 stored turns again, with and without them in the same transaction (rolled
-- back, 40 pairs alternated) differed by -0.03 ms a turn, within noise, since a GIN insert
-- only appends to its pending list; merging that list later cost ~0.015 ms a turn
-- (gin_clean_pending_list after 1,000 turns). bench/README.md, session 22.
SET search_path = agent_memory, public;

DROP INDEX IF EXISTS fragments_tsv_gin;
DROP INDEX IF EXISTS fragments_keywords_gin;
DROP INDEX IF EXISTS fragments_session;
