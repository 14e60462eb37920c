"""The schema is ready to be distributed by tenant (deploy/CAPACITY.md, issue 22 item 4).

The plan puts Engram on Citus with key_id as the distribution column: every tenant-owned
table distributed by it and co-located with fragments, the key tables replicated to every
node, a few operational tables left on the coordinator. Citus requires that every unique
index and every foreign key between distributed tables include the distribution column.

These tests read the catalog of a migrated database (the session stack's): every table of
the engine's schema is classified here exactly as CAPACITY.md's table plan classifies it (a
table added without a classification fails), every tenant-owned table has its key column,
and every unique index and foreign key between tenant-owned tables includes it or is one of
the exceptions listed below with its reason, each of which CAPACITY.md names. Exceptions of
the two structural kinds are checked for their structure, not only listed. Then the write
paths: each of them leaves the tenant on the child rows it writes, a key's removal carries
the change to them, and migration 0025 backfills a store written before it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest
from pgvector.asyncpg import register_vector

from shared.db import SEARCH_PATH
from shared.repositories import keys as keys_repo
from tests.support import Stack, call, create_api_key, mcp_session, migrated_before, unique

SCHEMA = "agent_memory"
CAPACITY = Path(__file__).resolve().parents[2] / "deploy" / "CAPACITY.md"
MIGRATION = "0025_tenant_key_on_fragment_children.sql"

DISTRIBUTED = "distributed"  # tenant-owned: distributed by its key column, co-located with fragments
REFERENCE = "reference"  # small, read on every call, written rarely: a copy on every node
LOCAL = "local"  # operational, never joined with tenant rows: stays on the coordinator

TABLES: dict[str, str] = {
    "fragments": DISTRIBUTED,
    "fragment_terms": DISTRIBUTED,
    "fragment_passages": DISTRIBUTED,
    "fragment_versions": DISTRIBUTED,
    "fragment_links": DISTRIBUTED,
    "fragment_link_pending": DISTRIBUTED,
    "passage_backfill": DISTRIBUTED,
    "fragment_artifacts": DISTRIBUTED,
    "mnemory_memories": DISTRIBUTED,
    "memory_namespaces": DISTRIBUTED,
    "memory_event_outbox": DISTRIBUTED,
    "memory_consolidation_status": DISTRIBUTED,
    "mnemory_session_summaries": DISTRIBUTED,
    "mnemory_remember_requests": DISTRIBUTED,
    "profile_projects": DISTRIBUTED,
    "consolidation_marks": DISTRIBUTED,
    "idempotency_records": DISTRIBUTED,
    "case_events": DISTRIBUTED,
    "sessions": DISTRIBUTED,
    "search_events": DISTRIBUTED,
    "tool_feedback": DISTRIBUTED,
    "task_feedback": DISTRIBUTED,
    "api_key_daily_usage": DISTRIBUTED,
    "api_keys": REFERENCE,
    "key_groups": REFERENCE,
    "key_group_members": REFERENCE,
    # The cells index's centroids (0033): read by its function on every node's writes.
    "vector_cells": REFERENCE,
    # Each cells version's training size (0035), beside its centroids.
    "vector_cell_versions": REFERENCE,
    "oauth_clients": LOCAL,
    "oauth_codes": LOCAL,
    "oauth_tokens": LOCAL,
    "job_outbox": LOCAL,
    "maintenance_runs": LOCAL,
    "fsck_issues": LOCAL,
    "artifact_purge_queue": LOCAL,
}

# The key column is key_id, except where a table names the tenant otherwise.
KEY_COLUMN: dict[str, str] = {
    # One row per tenant, '' for the master's own (0016): the tenant is the whole key.
    "memory_consolidation_status": "tenant",
}

# A surrogate key: the primary key is one generated column (a sequence, an identity, or an
# id the application draws at random), unique across tenants by construction. Citus needs
# (key_id, id); that waits for key_id NOT NULL (CAPACITY.md, "What changes").
SURROGATE = "surrogate"
# A fragment's child keyed by its fragment: the index leads with a column that a foreign key
# (that column, key_id) -> fragments (id, key_id) ties to the tenant, so the key is unique
# per tenant already; it becomes (key_id, ...) with key_id NOT NULL.
FRAGMENT_CHILD = "fragment child"
# Beside a composite foreign key (column, key_id) -> fragments (id, key_id): MATCH SIMPLE
# skips the master's rows (key_id NULL), so this single-column one still deletes them with
# their fragment. Dropped when the master's rows get a key of their own.
MASTER_CASCADE = "master cascade"

UNIQUE_EXCEPTIONS: dict[str, str] = {
    "fragments_pkey": SURROGATE,
    "fragment_versions_pkey": SURROGATE,
    "fragment_artifacts_pkey": SURROGATE,
    "memory_namespaces_pkey": SURROGATE,
    "memory_event_outbox_pkey": SURROGATE,
    "mnemory_session_summaries_pkey": SURROGATE,
    "mnemory_remember_requests_pkey": SURROGATE,
    "profile_projects_pkey": SURROGATE,
    "case_events_pkey": SURROGATE,
    "sessions_pkey": SURROGATE,
    "search_events_pkey": SURROGATE,
    "tool_feedback_pkey": SURROGATE,
    "task_feedback_pkey": SURROGATE,
    "fragment_passages_pkey": FRAGMENT_CHILD,
    "fragment_versions_fragment_id_version_key": FRAGMENT_CHILD,
    "fragment_link_pending_pkey": FRAGMENT_CHILD,
    "passage_backfill_pkey": FRAGMENT_CHILD,
    "mnemory_memories_pkey": FRAGMENT_CHILD,
    # Postings are written by fragments' own triggers (0006/0008) and rewritten whenever a
    # fragment's key_id changes; a composite key over ~20-30 postings a fragment is deferred
    # to the move, where the table is rebuilt anyway (CAPACITY.md, per-table plan).
    "fragment_terms_pkey": "postings: trigger-kept, rebuilt at the move",
    # A link may join two tenants of one group (the link tool links what the caller reads).
    "fragment_links_pkey": "links may cross tenants of one group",
}

FK_EXCEPTIONS: dict[str, str] = {
    "fragment_passages_fragment_id_fkey": MASTER_CASCADE,
    "fragment_versions_fragment_id_fkey": MASTER_CASCADE,
    "fragment_link_pending_fragment_id_fkey": MASTER_CASCADE,
    "passage_backfill_fragment_id_fkey": MASTER_CASCADE,
    "mnemory_memories_fragment_id_fkey": MASTER_CASCADE,
    "fragment_artifacts_fragment_id_fkey": MASTER_CASCADE,
    "fragment_links_from_id_fkey": "links may cross tenants of one group",
    "fragment_links_to_id_fkey": "links may cross tenants of one group",
    # A case event is the caller's; the fragment it names may be a group member's.
    "case_events_fragment_id_fkey": "the event's tenant is the caller's, not the fragment's",
    # Feedback is the caller's and names the search it rates, the same caller's by the write path.
    "tool_feedback_search_event_id_fkey": "enforced by the write path; composite at the move",
    # A fragment's namespace is chosen within its tenant by the write paths (and 0015's trigger).
    "fragments_namespace_id_fkey": "enforced by the write path; composite at the move",
}


@dataclass(frozen=True)
class Index:
    table: str
    name: str
    primary: bool
    columns: tuple[str | None, ...]  # None for an expression
    expressions: str


@dataclass(frozen=True)
class ForeignKey:
    name: str
    table: str
    columns: tuple[str, ...]
    target: str
    target_columns: tuple[str, ...]


@dataclass(frozen=True)
class Catalog:
    tables: set[str]
    columns: dict[str, set[str]]
    generated: set[tuple[str, str]]  # (table, column) with a sequence / identity default
    unique: list[Index]
    foreign: list[ForeignKey]


async def read_catalog(conn: asyncpg.Connection) -> Catalog:
    tables = {r["relname"] for r in await conn.fetch(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p') "
        "AND NOT c.relispartition", SCHEMA)}
    columns: dict[str, set[str]] = {}
    generated: set[tuple[str, str]] = set()
    for r in await conn.fetch(
        "SELECT table_name, column_name, column_default, is_identity FROM information_schema.columns WHERE table_schema = $1",
        SCHEMA,
    ):
        columns.setdefault(r["table_name"], set()).add(r["column_name"])
        if r["is_identity"] == "YES" or (r["column_default"] or "").startswith("nextval("):
            generated.add((r["table_name"], r["column_name"]))
    unique = [
        Index(r["tab"], r["idx"], r["indisprimary"], tuple(r["cols"]), r["exprs"] or "")
        for r in await conn.fetch(
            """
            SELECT t.relname AS tab, i.relname AS idx, x.indisprimary,
                   ARRAY(SELECT a.attname FROM unnest(x.indkey[0:x.indnkeyatts - 1]) WITH ORDINALITY AS k(attnum, n)
                         LEFT JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n) AS cols,
                   pg_get_expr(x.indexprs, x.indrelid) AS exprs
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
            WHERE t.relnamespace = $1::regnamespace AND x.indisunique
            """,
            SCHEMA,
        )
    ]
    foreign = [
        ForeignKey(r["conname"], r["tab"], tuple(r["cols"]), r["target"], tuple(r["target_cols"]))
        for r in await conn.fetch(
            """
            SELECT c.conname, t.relname AS tab, f.relname AS target,
                   ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
                         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum ORDER BY k.n) AS cols,
                   ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, n)
                         JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum ORDER BY k.n) AS target_cols
            FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_class f ON f.oid = c.confrelid
            WHERE c.contype = 'f' AND c.connamespace = $1::regnamespace
            """,
            SCHEMA,
        )
    ]
    return Catalog(tables, columns, generated, unique, foreign)


def key_column(table: str) -> str:
    return KEY_COLUMN.get(table, "key_id")


def includes_key(index: Index) -> bool:
    key = key_column(index.table)
    return key in index.columns or re.search(rf"\b{key}\b", index.expressions) is not None


def fk_includes_key(fk: ForeignKey) -> bool:
    """The key column of the referencing table paired with the target's key column."""
    pairs = dict(zip(fk.columns, fk.target_columns, strict=True))
    return pairs.get(key_column(fk.table)) == key_column(fk.target)


def tenant_fragment_fks(catalog: Catalog, table: str) -> set[str]:
    """Columns of `table` tied with key_id to fragments (id, key_id) by one foreign key."""
    return {
        fk.columns[fk.target_columns.index("id")]
        for fk in catalog.foreign
        if fk.table == table and fk.target == "fragments" and fk_includes_key(fk) and set(fk.target_columns) == {"id", "key_id"}
    }


def capacity_plan() -> dict[str, str]:
    """CAPACITY.md's per-table plan: rows `| \\`table\\` | class | ... |`."""
    text = CAPACITY.read_text(encoding="utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \| (distributed|reference|local) \|", text, re.M)}


@pytest.fixture
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(conn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def catalog(db: asyncpg.Connection) -> Catalog:
    return await read_catalog(db)


def test_capacity_plan_classifies_every_table_as_the_test_does() -> None:
    assert capacity_plan() == TABLES
    text = CAPACITY.read_text(encoding="utf-8")
    missing = [name for name in [*UNIQUE_EXCEPTIONS, *FK_EXCEPTIONS, *KEY_COLUMN] if f"`{name}`" not in text]
    assert not missing, f"exceptions the plan does not name: {missing}"


async def test_every_table_is_classified(catalog: Catalog) -> None:
    unclassified = sorted(catalog.tables - set(TABLES))
    assert not unclassified, f"classify these in {__name__}.TABLES and deploy/CAPACITY.md: {unclassified}"
    gone = sorted(set(TABLES) - catalog.tables)
    assert not gone, f"classified but not in the schema: {gone}"


async def test_every_tenant_owned_table_carries_its_key(catalog: Catalog) -> None:
    missing = [t for t, kind in TABLES.items() if kind == DISTRIBUTED and key_column(t) not in catalog.columns[t]]
    assert not missing, f"tenant-owned tables without their key column: {missing}"


async def test_every_unique_index_includes_the_key_or_is_a_documented_exception(catalog: Catalog) -> None:
    tenant_indexes = [i for i in catalog.unique if TABLES.get(i.table) == DISTRIBUTED]
    offending = [i.name for i in tenant_indexes if not includes_key(i) and i.name not in UNIQUE_EXCEPTIONS]
    assert not offending, f"unique indexes of tenant tables without the key, not documented: {offending}"

    by_name = {i.name: i for i in tenant_indexes}
    stale = [n for n in UNIQUE_EXCEPTIONS if n not in by_name or includes_key(by_name[n])]
    assert not stale, f"exceptions that no longer apply: {stale}"
    for name, reason in UNIQUE_EXCEPTIONS.items():
        index = by_name[name]
        if reason == SURROGATE:
            column = index.columns[0]
            assert index.primary and len(index.columns) == 1 and column is not None, name
            assert (index.table, column) in catalog.generated or column in {"id", "request_id"}, name
        elif reason == FRAGMENT_CHILD:
            assert index.columns[0] in tenant_fragment_fks(catalog, index.table), name

    assert any(i.table == "fragments" and i.columns == ("id", "key_id") for i in catalog.unique)


async def test_every_foreign_key_between_tenant_tables_includes_the_key_or_is_documented(catalog: Catalog) -> None:
    between = [fk for fk in catalog.foreign if TABLES[fk.table] == DISTRIBUTED and TABLES[fk.target] == DISTRIBUTED]
    offending = [fk.name for fk in between if not fk_includes_key(fk) and fk.name not in FK_EXCEPTIONS]
    assert not offending, f"foreign keys between tenant tables without the key, not documented: {offending}"

    by_name = {fk.name: fk for fk in between}
    stale = [n for n in FK_EXCEPTIONS if n not in by_name or fk_includes_key(by_name[n])]
    assert not stale, f"exceptions that no longer apply: {stale}"
    for name, reason in FK_EXCEPTIONS.items():
        if reason == MASTER_CASCADE:
            fk = by_name[name]
            assert fk.target == "fragments" and fk.columns[0] in tenant_fragment_fks(catalog, fk.table), name

    # No tenant table references a local one (Citus: a distributed table's foreign keys go to
    # co-located or reference tables only).
    assert not [fk.name for fk in catalog.foreign if TABLES[fk.table] == DISTRIBUTED and TABLES[fk.target] == LOCAL]
    assert not [fk.name for fk in catalog.foreign if TABLES[fk.table] == REFERENCE and TABLES[fk.target] != REFERENCE]


CHILDREN = ("fragment_passages", "fragment_versions", "fragment_link_pending", "mnemory_memories", "fragment_artifacts")


async def _children_keys(db: asyncpg.Connection, ids: list[str]) -> dict[str, set[str | None]]:
    return {
        table: {r["key_id"] for r in await db.fetch(f"SELECT key_id FROM {table} WHERE fragment_id = ANY($1::text[])", ids)}
        for table in CHILDREN
    }


THREE = "The canary rollout stalled at ten percent. The error budget was spent by noon. We paused it and paged the owner."


async def test_every_write_path_leaves_the_tenant_on_the_rows_it_writes(stack: Stack, db: asyncpg.Connection) -> None:
    key, key_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, key) as s:
        batch = await call(s, "batch_remember", {"workspace": unique(), "fragments": [
            {"content": THREE, "topic": "rollout", "type": "episode"},
            {"content": "The deploy freeze starts on Friday.", "topic": "rollout", "type": "fact"}]})
        batch_ids = [r["id"] for r in batch["results"]]
        amended = await call(s, "amend", {"id": batch_ids[1], "content": "The deploy freeze starts on Thursday. It ends Monday. "
                                          "Hotfixes need two approvals."})
        assert amended["updated"] is True
    headers = {"X-API-Key": key}
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=120) as http:
        reply = await http.post("/api/memories", json={"content": THREE.replace("canary", "blue-green"), "infer": False})
        assert reply.status_code == 200, reply.text
        mnemory_id = reply.json()["results"][0]["id"]
        reply = await http.post(f"/api/memories/{mnemory_id}/artifacts", json={"content": "postmortem", "filename": "note.txt"})
        assert reply.status_code == 200, reply.text
        reply = await http.post("/api/v1/memory/namespaces", json={"name": unique("ns"), "description": ""})
        assert reply.status_code == 201, reply.text
        ns = reply.json()["id"]
        entry = {"content": THREE.replace("noon", "ten"), "source": "manual"}
        reply = await http.post(f"/api/v1/memory/namespaces/{ns}/entries", json=entry)
        assert reply.status_code == 201, reply.text
        entry_id = reply.json()["id"]
    ids = [*batch_ids, mnemory_id, entry_id]

    assert {r["key_id"] for r in await db.fetch("SELECT key_id FROM fragments WHERE id = ANY($1::text[])", ids)} == {key_id}
    written = {t: await db.fetchval(f"SELECT count(*) FROM {t} WHERE fragment_id = ANY($1::text[])", ids) for t in CHILDREN}
    # Passages of the multi-sentence fragment of the batch, of the amended one and of the
    # REST entry (three writers of passages), a version, the mnemory row, the artifact; the
    # link queue's rows may be gone already (the worker's sweep takes them).
    with_passages = {r["fragment_id"] for r in await db.fetch(
        "SELECT DISTINCT fragment_id FROM fragment_passages WHERE fragment_id = ANY($1::text[])", ids)}
    assert {batch_ids[0], batch_ids[1], entry_id} <= with_passages, (ids, with_passages)
    assert written["fragment_versions"] == 1
    assert written["mnemory_memories"] == 1 and written["fragment_artifacts"] == 1
    keys = await _children_keys(db, ids)
    assert all(found <= {key_id} for found in keys.values()), keys

    # The key goes: its fragments become the master's own, and their children follow.
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        assert await keys_repo.delete_key(conn, key_id)
    finally:
        await conn.close()
    assert {r["key_id"] for r in await db.fetch("SELECT key_id FROM fragments WHERE id = ANY($1::text[])", ids)} == {None}
    keys = await _children_keys(db, ids)
    assert all(found <= {None} for found in keys.values()), keys
    await db.execute("DELETE FROM fragments WHERE id = ANY($1::text[])", ids)
    left = {t: await db.fetchval(f"SELECT count(*) FROM {t} WHERE fragment_id = ANY($1::text[])", ids) for t in CHILDREN}
    assert set(left.values()) == {0}, left


async def test_a_child_row_cannot_name_another_tenant(stack: Stack, db: asyncpg.Connection) -> None:
    key, key_id = await create_api_key(stack.database_url)
    _, other_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, key) as s:
        fid = (await call(s, "remember", {"content": THREE, "topic": "rollout", "type": "episode", "workspace": unique()}))["id"]
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await db.execute(
            "INSERT INTO fragment_versions (fragment_id, key_id, version, content, topic, type, importance) "
            "VALUES ($1, $2, 99, 'x', 'x', 'fact', 0.5)", fid, other_id)
    assert await db.fetchval("SELECT key_id FROM fragment_passages WHERE fragment_id = $1 LIMIT 1", fid) == key_id


async def test_migration_backfills_a_store_written_before_it(stack: Stack) -> None:
    """A database migrated up to 0024 with data in every child table, then 0025 and the rest."""
    async with migrated_before(stack.database_url, MIGRATION) as (conn, rest):
        await _store_before_0025(conn)
        for _, sql in rest:
            await conn.execute(sql)

        for table in ("fragment_passages", "fragment_versions", "mnemory_memories", "fragment_link_pending",
                      "passage_backfill", "fragment_artifacts"):
            rows = await conn.fetch(
                f"SELECT c.fragment_id, c.key_id, f.key_id AS parent FROM {table} c JOIN fragments f ON f.id = c.fragment_id")
            assert {r["fragment_id"] for r in rows} == {"f-keyed", "f-master"}, table
            assert all(r["key_id"] == r["parent"] for r in rows), (table, [dict(r) for r in rows])
        # Written after the migration: the link queue's trigger carries the key.
        await conn.execute("INSERT INTO fragments (id, content, topic, type, key_id, content_hash) "
                           "VALUES ('f-later', 'Later.', 't', 'fact', 'k-old', 'h3')")
        assert await conn.fetchval("SELECT key_id FROM fragment_link_pending WHERE fragment_id = 'f-later'") == "k-old"
        catalog = await read_catalog(conn)
        assert {"fragment_passages", "fragment_versions"} <= {fk.table for fk in catalog.foreign if fk_includes_key(fk)}


async def _store_before_0025(conn: asyncpg.Connection) -> None:
    """One keyed and one master fragment with a row in every child table; an artifact whose
    key a deleted key left behind (its fragment moved to the master's own)."""
    await conn.execute("INSERT INTO api_keys (id, name, key_hash, key_prefix) VALUES ('k-old', 'old', 'hash-old', 'p')")
    for fid, key in (("f-keyed", "k-old"), ("f-master", None)):
        await conn.execute(
            "INSERT INTO fragments (id, content, topic, type, key_id, content_hash) VALUES ($1, 'One. Two. Three.', 't', 'fact', $2, $1)",
            fid, key)
        await conn.execute("INSERT INTO fragment_passages (fragment_id, ordinal, embedding) VALUES ($1, 0, $2)", fid, [0.1] * 384)
        await conn.execute("INSERT INTO fragment_versions (fragment_id, version, content, topic, type, importance) "
                           "VALUES ($1, 1, 'One.', 't', 'fact', 0.5)", fid)
        await conn.execute("INSERT INTO mnemory_memories (fragment_id) VALUES ($1)", fid)
        await conn.execute("INSERT INTO passage_backfill (fragment_id) VALUES ($1)", fid)
        await conn.execute(
            "INSERT INTO fragment_artifacts (id, fragment_id, key_id, filename, content_type, size, sha256, backend, storage_key) "
            "VALUES ($1, $2, 'k-gone', 'a.txt', 'text/plain', 1, 'x', 'disk', $1)", f"a-{fid}", fid)
