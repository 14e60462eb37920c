-- Every page of fragments keeps room for one more version of any row on it, so that recall's
-- side effects (access count, last access, activation) and maintenance's rewrites of tier and
-- activation stay HOT updates: the new version goes on the same page and no index gets a new
-- entry. (Importance is in the scope indexes, so an update of it is never HOT.)
--
-- 0005 set fillfactor 80 for this when a row was ~2.4 KB. 0027 added the half vector (~0.8 KB),
-- and a row is now ~3.2 KB (the float and half vectors alone are 2.3 KB): two rows fill a page
-- to within 1.7 KB, a new version no longer fits, and every update went into every index again,
-- the two HNSW graphs a row sits in (0028) included. At 1M fragments, updating the access
-- counts of 20 rows took 132-164 ms of Postgres; the same statement on the same rows once
-- they had room, 0.4-0.6 ms. Recall updates the ~10 rows it returns, so this work ran beside
-- every query, and the visibility VACUUM then had dead entries to clean from all 26 indexes
-- (bench/README.md, session 20).
--
-- Why 65: a page takes rows while the free space after the new one stays above the reserve
-- R = 8192 x (100 - fillfactor) %. A row no larger than R always leaves room for its next
-- version. A larger one is alone on its page once R >= ~2.72 KB (fillfactor <= 66): a second
-- row of that size is refused, and a lone row up to toast_tuple_target (4080, 0006) has its
-- version's room. At fillfactor 70 rows of 2.72-2.85 KB would still pair up without room.
-- Cost: rows of ~2.65 KB and more take a page each, so at the bench's 3.2 KB the heap is about
-- twice the size it was at 80.
--
-- Catalog only: pages written from now on follow it. A row on a full page moves once, on its
-- next update (a non-HOT update, as before), to a page with room, and stays HOT from then on.
SET search_path = agent_memory, public;

ALTER TABLE fragments SET (fillfactor = 65);
