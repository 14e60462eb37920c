"""Maintenance runs (one row per consolidation / fsck / reflect run) and tenant scoping.

A run row is the unit operators and tools read: created before the job is sent (so the
job never looks for a row that doesn't exist), `running` while a worker holds it, then
`succeeded` / `failed` / `skipped` with a JSON result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from shared.domain.principal import Principal, SqlParams, TenantScope, scope_clause
from shared.repositories import keys as keys_repo


@dataclass(frozen=True)
class Tenant:
    """What one maintenance run covers: every tenant, or one key (key_id None = the master
    key's own fragments). Stages that compare fragments always also partition by key_id,
    so even an all-tenant run never pairs two keys' fragments."""

    all: bool = True
    key_id: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Tenant:
        if not text or text == "all":
            return cls()
        if text == "master":
            return cls(all=False, key_id=None)
        if text.startswith("key:") and len(text) > 4:
            return cls(all=False, key_id=text[4:])
        raise ValueError(f"tenant must be 'all', 'master' or 'key:<id>', not {text!r}")

    @classmethod
    def of(cls, principal: Principal) -> Tenant:
        """An admin key maintains its own fragments; the master key maintains everyone's."""
        return cls() if principal.is_master else cls(all=False, key_id=principal.key_id)

    @property
    def label(self) -> str:
        if self.all:
            return "all"
        return "master" if self.key_id is None else f"key:{self.key_id}"

    @property
    def scope(self) -> TenantScope:
        """The run's rows, for shared.domain.principal.scope_clause."""
        return TenantScope(everyone=True) if self.all else TenantScope.key(self.key_id)


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


async def create_run(conn: asyncpg.Connection, job: str, tenant: Tenant, params: dict[str, Any] | None = None) -> int:
    return int(
        await conn.fetchval(
            "INSERT INTO maintenance_runs (job, tenant, params, status) VALUES ($1, $2, $3::jsonb, 'queued') RETURNING id",
            job, tenant.label, _json(params or {}),
        )
    )


async def claim_run(conn: asyncpg.Connection, run_id: int) -> asyncpg.Record | None:
    """Mark a queued (or crashed, or failed and retried) run as running; None when it succeeded
    or was skipped.

    A redelivered task (acks_late after a worker crash) finds its row `running` and takes it
    over; a duplicate delivery of a finished run does nothing.
    """
    return await conn.fetchrow(
        """
        UPDATE maintenance_runs SET status = 'running', started_at = now(), error = NULL
        WHERE id = $1 AND status IN ('queued', 'running', 'failed')
        RETURNING id, job, tenant, params
        """,
        run_id,
    )


async def set_progress(conn: asyncpg.Connection, run_id: int, progress: dict[str, Any]) -> None:
    await conn.execute("UPDATE maintenance_runs SET progress = $2::jsonb WHERE id = $1", run_id, _json(progress))


async def finish_run(
    conn: asyncpg.Connection, run_id: int, status: str, result: dict[str, Any], error: str | None = None
) -> None:
    await conn.execute(
        """
        UPDATE maintenance_runs SET status = $2, result = $3::jsonb, error = $4, finished_at = now()
        WHERE id = $1
        """,
        run_id, status, _json(result), error,
    )


async def latest_anomaly_scan(conn: asyncpg.Connection) -> asyncpg.Record | None:
    """The latest finished consolidation run whose report has an anomalies stage."""
    return await conn.fetchrow(
        """SELECT * FROM maintenance_runs WHERE job = 'consolidate' AND status IN ('succeeded', 'failed')
           AND result -> 'stages' -> 'anomalies' ? 'anomalies' ORDER BY finished_at DESC LIMIT 1"""
    )


async def get_run(conn: asyncpg.Connection, run_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM maintenance_runs WHERE id = $1", run_id)


async def recent_runs(conn: asyncpg.Connection, job: str | None, limit: int) -> list[asyncpg.Record]:
    if job:
        return await conn.fetch(
            "SELECT * FROM maintenance_runs WHERE job = $1 ORDER BY started_at DESC LIMIT $2", job, limit
        )
    return await conn.fetch("SELECT * FROM maintenance_runs ORDER BY started_at DESC LIMIT $1", limit)


def run_to_wire(row: asyncpg.Record) -> dict[str, Any]:
    def parse(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    return {
        "runId": row["id"],
        "job": row["job"],
        "tenant": row["tenant"],
        "status": row["status"],
        "startedAt": row["started_at"].isoformat() if row["started_at"] else None,
        "finishedAt": row["finished_at"].isoformat() if row["finished_at"] else None,
        "error": row["error"],
        "progress": parse(row["progress"]),
        "result": parse(row["result"]),
    }


async def consolidation_status(conn: asyncpg.Connection, *, enabled: bool, interval: timedelta) -> dict[str, Any]:
    """The scheduled all-tenant cycle: when it last succeeded, was last tried, and why it failed."""
    row = await conn.fetchrow(
        """
        SELECT
          (SELECT max(finished_at) FROM maintenance_runs
            WHERE job = 'consolidate' AND tenant = 'all' AND status = 'succeeded') AS last_run_at,
          (SELECT max(started_at) FROM maintenance_runs WHERE job = 'consolidate' AND tenant = 'all') AS last_attempt_at,
          (SELECT error FROM maintenance_runs WHERE job = 'consolidate' AND tenant = 'all' AND status = 'failed'
            ORDER BY started_at DESC LIMIT 1) AS last_error,
          (SELECT status FROM maintenance_runs WHERE job = 'consolidate' AND tenant = 'all'
            ORDER BY started_at DESC LIMIT 1) AS last_status,
          now() AS now
        """
    )
    last_run = row["last_run_at"]
    due = enabled and (last_run is None or row["now"] - last_run >= interval)
    return {
        "enabled": enabled,
        "intervalHours": round(interval.total_seconds() / 3600, 4),
        "due": due,
        "lastRunAt": last_run.isoformat() if last_run else None,
        "lastAttemptAt": row["last_attempt_at"].isoformat() if row["last_attempt_at"] else None,
        "lastStatus": row["last_status"],
        # The error of the latest failed attempt, kept until a later attempt succeeds.
        "lastError": row["last_error"] if row["last_status"] != "succeeded" else None,
    }


async def principal_for_key_id(conn: asyncpg.Connection, key_id: str | None) -> Principal | None:
    """The principal a background job acts as for a key (None = the master key); an
    inactive key's session is still reflected as that key."""
    if key_id is None:
        return Principal.master()
    return await keys_repo.principal_for_key_id(conn, key_id, active_only=False)


# -- AutoReflect -------------------------------------------------------------------------
# A session whose reflect failed this many times is left alone (reflect_error says why).
MAX_REFLECT_ATTEMPTS = 5


async def session_row(conn: asyncpg.Connection, session_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT id, key_id, workspace, started_at, ended_at, end_reason, reflected_at, activity FROM sessions WHERE id = $1",
        session_id,
    )


async def session_fragments(conn: asyncpg.Connection, session_id: str, key_id: str | None) -> list[asyncpg.Record]:
    """The session's fragments of that key only (a session never spans tenants)."""
    params = SqlParams()
    session = params.add(session_id)
    scope = scope_clause(TenantScope.key(key_id), params)
    return await conn.fetch(
        f"""
        SELECT f.id, f.type, f.content, f.topic, f.workspace, f.resolution_status, f.outcome, f.created_at
        FROM fragments f WHERE f.session_id = {session} AND {scope}
        ORDER BY f.created_at, f.id LIMIT 500
        """,
        *params.values,
    )


async def already_reflected(conn: asyncpg.Connection, session_id: str) -> bool:
    return bool(
        await conn.fetchval(
            """
            SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND reflected_at IS NOT NULL)
                OR EXISTS (SELECT 1 FROM maintenance_runs WHERE job = 'auto_reflect'
                           AND status = 'succeeded' AND params->>'sessionId' = $1)
            """,
            session_id,
        )
    )


async def mark_reflected(conn: asyncpg.Connection, session_id: str) -> None:
    await conn.execute(
        "UPDATE sessions SET reflected_at = now(), reflect_error = NULL WHERE id = $1 AND reflected_at IS NULL", session_id
    )


async def record_reflect_failure(conn: asyncpg.Connection, session_id: str, error: str) -> None:
    await conn.execute(
        "UPDATE sessions SET reflect_attempts = reflect_attempts + 1, reflect_error = $2 WHERE id = $1",
        session_id, error[:500],
    )


async def unreflected_sessions(conn: asyncpg.Connection, limit: int) -> list[asyncpg.Record]:
    """Ended sessions nobody reflected yet (the post-end job was lost, or failed)."""
    return await conn.fetch(
        """
        SELECT id, key_id, end_reason FROM sessions
        WHERE ended_at IS NOT NULL AND reflected_at IS NULL AND reflect_attempts < $1
        ORDER BY ended_at LIMIT $2
        """,
        MAX_REFLECT_ATTEMPTS, limit,
    )


# fragments is read index-only by recall (the scope counts and the exact ranking's covering
# index, fragments_scope_vectors), which needs its visibility map. Every recall updates the
# rows it returns (activation, access counts): HOT updates, pruned on the page, so dead tuples
# never add up to autovacuum's threshold, while each one clears its page's all-visible bit, and
# an index-only scan then reads that heap page for every row on it. At 1M fragments a few
# hundred recall passes left 8.5% of the heap pages not all-visible (bench/README.md, session 15).
#
# A VACUUM that finds dead row versions also cleans them out of every index, the HNSW graphs
# included: at 1M fragments, 45k dead versions took 51 s. Under the pool's 30 s command timeout
# it was cancelled, retried and cancelled again, every interval, and never finished.
VACUUM_TIMEOUT_S = 1800.0


async def vacuum_for_visibility(conn: asyncpg.Connection) -> dict[str, int]:
    """VACUUM fragments (outside a transaction; skipped while another VACUUM or a lock holds
    it, until the next run), then its heap pages and how many are all-visible, as VACUUM left
    pg_class. VACUUM reads only the pages the map does not mark all-visible, so a run costs
    what the reads since the last one cleared, and what index cleanup its dead versions need
    (VACUUM_TIMEOUT_S)."""
    await conn.execute("VACUUM (SKIP_LOCKED) fragments", timeout=VACUUM_TIMEOUT_S)
    row = await conn.fetchrow("SELECT relpages, relallvisible FROM pg_class WHERE oid = 'fragments'::regclass")
    return {"pages": int(row["relpages"]), "all_visible": int(row["relallvisible"])}
