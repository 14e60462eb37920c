"""fsck: the fragments to check, the issues found (kept for review), and applying fixes.

Applying lives here (not in the worker) because the admin API applies selected fixes
directly; every action is re-checked against the issue's tenant before it touches a row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from shared.domain.fragment import content_hash
from shared.domain.fsck import Issue
from shared.domain.principal import SqlParams, same_tenant, scope_clause
from shared.repositories import fragments as fragments_repo
from shared.repositories import mnemory_memories as mnemory_repo
from shared.repositories.maintenance import Tenant


@dataclass(frozen=True)
class Selection:
    """/api/fsck's scope (reference 004): raw provisional memories only with include_raw,
    and optionally one agent, one memory_type, any of some categories. A run without one
    (admin API, MCP, beat's auto-fsck) checks every fragment of its tenant."""

    agent_id: str | None = None
    categories: tuple[str, ...] = ()
    memory_type: str | None = None
    include_raw: bool = False

    @classmethod
    def of_params(cls, params: Any) -> Selection | None:
        """The selection a run's params carry; None when they name none (runs not started by /api/fsck)."""
        if isinstance(params, str):
            params = json.loads(params or "{}")
        if not isinstance(params, dict) or "include_raw" not in params:
            return None
        return cls(
            agent_id=params.get("agent_id") or None, categories=tuple(params.get("categories") or ()),
            memory_type=params.get("memory_type") or None, include_raw=bool(params["include_raw"]),
        )

    def where(self, params: SqlParams) -> str:
        """Clauses over `fragments f LEFT JOIN mnemory_memories m` (a fragment without an m row
        is a consolidated memory without categories, as the REST reads say)."""
        clauses = [] if self.include_raw else ["coalesce(m.memory_layer, 'consolidated') <> 'raw'"]
        if self.agent_id:
            clauses.append(f"f.agent_id = {params.add(self.agent_id)}")
        if self.memory_type:
            clauses.append(f"{mnemory_repo.MEMORY_TYPE_SQL} = {params.add(self.memory_type)}")
        if self.categories:  # as the REST listing filters
            clauses.append(mnemory_repo.category_clause(self.categories, params))
        return "".join(f" AND {c}" for c in clauses)


async def fragments_to_check(
    conn: asyncpg.Connection, tenant: Tenant, *, incremental: bool, limit: int, selection: Selection | None = None
) -> list[asyncpg.Record]:
    params = SqlParams()
    scope = scope_clause(tenant.scope, params)
    changed = " AND (f.checked_at IS NULL OR f.updated_at > f.checked_at)" if incremental else ""
    joined, selected = "", ""
    if selection is not None:
        joined, selected = " LEFT JOIN mnemory_memories m ON m.fragment_id = f.id", selection.where(params)
    return await conn.fetch(
        f"""
        SELECT f.id, f.key_id, f.content, f.topic, f.type, f.keywords, f.is_anchor, f.importance
        FROM fragments f{joined} WHERE {scope} AND f.valid_to IS NULL{changed}{selected}
        ORDER BY f.created_at LIMIT {params.add(limit)}
        """,
        *params.values,
    )


async def within_selection(conn: asyncpg.Connection, ids: list[str], selection: Selection) -> set[str]:
    """Those of the fragments the selection admits (duplicate partners outside it are left alone)."""
    params = SqlParams()
    any_of = params.add(ids)
    rows = await conn.fetch(
        f"""SELECT f.id FROM fragments f LEFT JOIN mnemory_memories m ON m.fragment_id = f.id
            WHERE f.id = ANY({any_of}::text[]){selection.where(params)}""",
        *params.values,
    )
    return {r["id"] for r in rows}


async def clear_issues(conn: asyncpg.Connection, run_id: int) -> None:
    """A retried run starts its issue list afresh."""
    await conn.execute("DELETE FROM fsck_issues WHERE run_id = $1", run_id)


async def groups_of(conn: asyncpg.Connection, ids: list[str]) -> list[tuple[str | None, str | None, str]]:
    """The (key, workspace, topic) groups the fragments belong to: duplicates are looked for
    inside a group, never across keys."""
    rows = await conn.fetch("SELECT DISTINCT key_id, workspace, topic FROM fragments WHERE id = ANY($1::text[])", ids)
    return [(r["key_id"], r["workspace"], r["topic"]) for r in rows]


SEVERITIES = ("low", "medium", "high")


async def qualifying_issues(conn: asyncpg.Connection, run_id: int, min_confidence: float, min_severity: str) -> list[int]:
    """The run's issues at or above both thresholds (FSCK_AUTO_MIN_CONFIDENCE / _SEVERITY)."""
    severities = list(SEVERITIES[SEVERITIES.index(min_severity):])
    rows = await conn.fetch(
        "SELECT id FROM fsck_issues WHERE run_id = $1 AND confidence >= $2 AND severity = ANY($3::text[])",
        run_id, min_confidence, severities,
    )
    return [r["id"] for r in rows]


async def mark_checked(conn: asyncpg.Connection, ids: list[str]) -> None:
    # In chunks: each stamp rewrites a row (see consolidation.WRITE_CHUNK).
    for start in range(0, len(ids), 1000):
        await conn.execute("UPDATE fragments SET checked_at = now() WHERE id = ANY($1::text[])", ids[start:start + 1000])


async def open_contradictions(conn: asyncpg.Connection, ids: list[str]) -> list[asyncpg.Record]:
    """contradicts links between two live fragments of one key touching the checked ones."""
    return await conn.fetch(
        f"""
        SELECT l.from_id, l.to_id, l.weight, n.key_id, n.content AS new_content, o.content AS old_content
        FROM fragment_links l JOIN fragments n ON n.id = l.from_id JOIN fragments o ON o.id = l.to_id
        WHERE l.relation_type = 'contradicts' AND (l.from_id = ANY($1::text[]) OR l.to_id = ANY($1::text[]))
          AND n.valid_to IS NULL AND o.valid_to IS NULL AND {same_tenant('n', 'o')}
        """,
        ids,
    )


async def insert_issues(conn: asyncpg.Connection, run_id: int, issues: list[tuple[str | None, Issue]]) -> None:
    if issues:
        await conn.executemany(
            """
            INSERT INTO fsck_issues (run_id, key_id, issue_type, severity, confidence, fragment_ids, reason, actions)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)
            """,
            [(run_id, key_id, i.issue_type, i.severity, i.confidence, i.fragment_ids, i.reason, json.dumps(i.actions))
             for key_id, i in issues],
        )


async def issues_of_run(conn: asyncpg.Connection, run_id: int) -> list[dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM fsck_issues WHERE run_id = $1 ORDER BY id", run_id)
    return [
        {
            "id": r["id"], "keyId": r["key_id"], "type": r["issue_type"], "severity": r["severity"],
            "confidence": round(float(r["confidence"]), 3), "fragmentIds": list(r["fragment_ids"]),
            "reason": r["reason"], "actions": json.loads(r["actions"]) if isinstance(r["actions"], str) else r["actions"],
            "status": r["status"], "appliedAt": r["applied_at"].isoformat() if r["applied_at"] else None,
        }
        for r in rows
    ]


class FixRefused(Exception):
    """An action that would touch another tenant's fragment, or a fragment that is gone."""


async def _apply_action(conn: asyncpg.Connection, key_id: str | None, action: dict[str, Any]) -> None:
    row = await conn.fetchrow("SELECT id, key_id FROM fragments WHERE id = $1 FOR UPDATE", action["id"])
    if row is None or row["key_id"] != key_id:
        raise FixRefused(f"fragment {action['id']} is gone or not this tenant's")
    kind = action["action"]
    if kind == "delete":
        await conn.execute("DELETE FROM fragments WHERE id = $1", action["id"])
    elif kind == "supersede":
        by = await conn.fetchrow("SELECT key_id FROM fragments WHERE id = $1", action["by"])
        if by is None or by["key_id"] != key_id:
            raise FixRefused(f"fragment {action['by']} is gone or not this tenant's")
        await conn.execute(
            "UPDATE fragments SET valid_to = now(), superseded_by = $2, updated_at = now() WHERE id = $1 AND valid_to IS NULL",
            action["id"], action["by"],
        )
        await conn.execute(
            """INSERT INTO fragment_links (from_id, to_id, relation_type, weight, key_id)
               VALUES ($1, $2, 'superseded_by', 1, $3) ON CONFLICT DO NOTHING""",
            action["id"], action["by"], key_id,
        )
    elif kind == "update":
        if "content" in action:
            # New text: new hash and full-text vector; the embedding is cleared so the
            # backfill stage re-embeds it (a stale vector would find the old text).
            await conn.execute(
                """
                UPDATE fragments SET content = $2, content_hash = $3, embedding = NULL, updated_at = now()
                WHERE id = $1
                """,
                action["id"], action["content"], content_hash(action["content"]),
            )
        for column in ("keywords", "topic", "type"):
            if column in action:
                await conn.execute(f"UPDATE fragments SET {column} = $2, updated_at = now() WHERE id = $1", action["id"], action[column])
        await fragments_repo.refresh_search_tsv(conn, action["id"])
    else:
        raise FixRefused(f"unknown action {kind!r}")


async def apply_issues(conn: asyncpg.Connection, run_id: int, issue_ids: list[int] | None) -> dict[str, Any]:
    """Apply the selected open issues of a run (all open ones when issue_ids is None), each
    in its own savepoint: a refused fix is marked failed, the others still apply."""
    if issue_ids is None:
        rows = await conn.fetch("SELECT * FROM fsck_issues WHERE run_id = $1 AND status = 'open' ORDER BY id", run_id)
    else:
        rows = await conn.fetch(
            "SELECT * FROM fsck_issues WHERE run_id = $1 AND id = ANY($2::bigint[]) AND status = 'open' ORDER BY id",
            run_id, issue_ids,
        )
    applied, failed = [], []
    for row in rows:
        actions = json.loads(row["actions"]) if isinstance(row["actions"], str) else row["actions"]
        try:
            async with conn.transaction():
                for action in actions:
                    await _apply_action(conn, row["key_id"], action)
        except FixRefused as exc:
            failed.append({"id": row["id"], "error": str(exc)})
            await conn.execute("UPDATE fsck_issues SET status = 'failed' WHERE id = $1", row["id"])
            continue
        applied.append(row["id"])
        await conn.execute("UPDATE fsck_issues SET status = 'applied', applied_at = now() WHERE id = $1", row["id"])
    return {"applied": applied, "failed": failed}


async def tenants_with_fragments(conn: asyncpg.Connection) -> list[Tenant]:
    rows = await conn.fetch("SELECT DISTINCT key_id FROM fragments WHERE valid_to IS NULL")
    return [Tenant(all=False, key_id=r["key_id"]) for r in rows]
