"""Changing fragments after they were written: amend's update with its version rows,
supersession, and the case back-propagation of importance."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, scope_clause
from shared.repositories import fragments as fragments_repo
from shared.repositories import links as links_repo
from shared.repositories.fragments import FRAGMENT_COLUMNS

# Columns amend may set; search_tsv is recomputed from content / topic / keywords in SQL
# the same way the insert writes it.
AMENDABLE = (
    "content", "topic", "keywords", "type", "importance", "is_anchor", "ttl_tier", "assertion_status",
    "resolution_status", "outcome", "phase", "content_hash", "embedding",
)


async def lock_owned(conn: asyncpg.Connection, principal: Principal, fragment_id: str) -> asyncpg.Record | None:
    """The caller's own fragment, row-locked for the rest of the transaction."""
    params = SqlParams()
    return await conn.fetchrow(
        f"""
        SELECT {FRAGMENT_COLUMNS}, f.content_hash, f.embedding::vector AS embedding FROM fragments f
        WHERE f.id = {params.add(fragment_id)} AND {scope_clause(principal.writes, params)}
        FOR UPDATE
        """,
        *params.values,
    )


async def owned_ids(conn: asyncpg.Connection, principal: Principal, ids: list[str]) -> set[str]:
    params = SqlParams()
    rows = await conn.fetch(
        f"SELECT f.id FROM fragments f WHERE f.id = ANY({params.add(ids)}::text[]) AND {scope_clause(principal.writes, params)}",
        *params.values,
    )
    return {r["id"] for r in rows}


def _snapshot(row: asyncpg.Record) -> str:
    skip = {"embedding"}
    return json.dumps({k: v for k, v in dict(row).items() if k not in skip}, default=str, ensure_ascii=False)


async def record_version(conn: asyncpg.Connection, row: asyncpg.Record, changed_by: str | None) -> int:
    """Keep the state before a change as the next version row; returns its number."""
    return int(
        await conn.fetchval(
            """
            INSERT INTO fragment_versions (fragment_id, key_id, version, content, topic, type, keywords, importance, snapshot, changed_by)
            SELECT $1, (SELECT key_id FROM fragments WHERE id = $1), coalesce(max(version), 0) + 1, $2, $3, $4, $5, $6, $7::jsonb, $8
            FROM fragment_versions WHERE fragment_id = $1
            RETURNING version
            """,
            row["id"], row["content"], row["topic"], row["type"], row["keywords"], row["importance"],
            _snapshot(row), changed_by,
        )
    )


async def apply_changes(conn: asyncpg.Connection, fragment_id: str, changes: dict[str, Any]) -> None:
    unknown = set(changes) - set(AMENDABLE)
    if unknown:
        raise ValueError(f"not amendable: {sorted(unknown)}")
    if not changes:
        return
    names = list(changes)
    sets = [f"{name} = ${i}" for i, name in enumerate(names, start=2)]
    await conn.execute(
        f"UPDATE fragments SET {', '.join(sets)}, updated_at = now() WHERE id = $1", fragment_id, *changes.values()
    )
    await fragments_repo.refresh_search_tsv(conn, fragment_id)


async def supersede(conn: asyncpg.Connection, principal: Principal, new_id: str, targets: list[str]) -> list[str]:
    """seed: superseded fragments get valid_to, half their importance, and a superseded_by link."""
    if not targets:
        return []
    params = SqlParams()
    ids = params.add(targets)
    new = params.add(new_id)
    rows = await conn.fetch(
        f"""
        UPDATE fragments f SET valid_to = now(), importance = f.importance / 2, superseded_by = {new}, updated_at = now()
        WHERE f.id = ANY({ids}::text[]) AND f.id <> {new} AND f.valid_to IS NULL AND {scope_clause(principal.writes, params)}
        RETURNING f.id
        """,
        *params.values,
    )
    done = [r["id"] for r in rows]
    for old in done:
        await links_repo.insert_link(conn, old, new_id, "superseded_by", 1.0, principal.key_id)
    return done


# MEMENTO_CASE_BACKPROP_ENABLED: a resolved case lifts its fragments, an abandoned one
# lowers them, by this much (importance stays within [0, 1]).
BACKPROP_STEP = 0.1


async def backprop_case(conn: asyncpg.Connection, principal: Principal, case_id: str, status: str, exclude: str) -> int:
    if status == "resolved":
        expr = f"least(1.0, f.importance + {BACKPROP_STEP})"
    elif status == "abandoned":
        expr = f"greatest(0.0, f.importance - {BACKPROP_STEP})"
    else:
        return 0
    params = SqlParams()
    status_text = await conn.execute(
        f"""
        UPDATE fragments f SET importance = {expr}, updated_at = now()
        WHERE f.case_id = {params.add(case_id)} AND f.id <> {params.add(exclude)} AND f.valid_to IS NULL
          AND {scope_clause(principal.writes, params)}
        """,
        *params.values,
    )
    return int(status_text.split()[-1])
