"""API keys and key groups."""

from __future__ import annotations

import hashlib
import secrets
from datetime import date
from typing import Any

import asyncpg

from shared.domain.principal import Principal

KEY_PREFIX = "mmcp_"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def generate_raw_key() -> str:
    return f"{KEY_PREFIX}{secrets.token_hex(24)}"


_PRINCIPAL_SQL = """
    SELECT k.*, ARRAY(
        SELECT DISTINCT m2.key_id FROM key_group_members m1
        JOIN key_group_members m2 ON m2.group_id = m1.group_id
        WHERE m1.key_id = k.id
    ) AS group_key_ids
    FROM api_keys k WHERE {where}
"""


async def principal_for_raw_key(conn: asyncpg.Connection, raw: str) -> Principal | None:
    """The active key with this raw value, with the keys its groups let it read."""
    return _principal(await conn.fetchrow(_PRINCIPAL_SQL.format(where="k.key_hash = $1 AND k.status = 'active'"), hash_key(raw)))


async def principal_for_key_id(conn: asyncpg.Connection, key_id: str, *, active_only: bool = True) -> Principal | None:
    """The key with this id (an OAuth token bound to it), as principal_for_raw_key.
    Background jobs finishing a key's work (reflect of its session) pass active_only=False."""
    where = "k.id = $1 AND k.status = 'active'" if active_only else "k.id = $1"
    return _principal(await conn.fetchrow(_PRINCIPAL_SQL.format(where=where), key_id))


def _principal(row: asyncpg.Record | None) -> Principal | None:
    if row is None:
        return None
    visible = tuple(sorted({row["id"], *row["group_key_ids"]}))
    return Principal(
        key_id=row["id"],
        key_name=row["name"],
        visible_key_ids=visible,
        permissions=tuple(row["permissions"] or ()),
        default_workspace=row["default_workspace"],
        allowed_workspaces=tuple(row["allowed_workspaces"]) if row["allowed_workspaces"] is not None else None,
        default_mode=row["default_mode"],
        fragment_limit=row["fragment_limit"],
        daily_limit=row["daily_limit"],
        symbolic_hard_gate=row["symbolic_hard_gate"],
    )


async def create_key(conn: asyncpg.Connection, *, name: str, **fields: Any) -> tuple[str, asyncpg.Record]:
    """Create a key; the raw value is returned once and only its hash is stored."""
    raw = generate_raw_key()
    key_id = secrets.token_hex(8)
    columns = ["id", "name", "key_hash", "key_prefix", *fields.keys()]
    values = [key_id, name, hash_key(raw), raw[:12], *fields.values()]
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    row = await conn.fetchrow(
        f"INSERT INTO api_keys ({', '.join(columns)}) VALUES ({placeholders}) RETURNING *", *values
    )
    return raw, row


# -- admin: keys ---------------------------------------------------------------------
# Columns an operator may set on a key; nothing else reaches the INSERT / UPDATE.
KEY_SETTABLE = (
    "status", "permissions", "default_workspace", "allowed_workspaces", "default_mode",
    "daily_limit", "fragment_limit", "symbolic_hard_gate",
)
KEY_PUBLIC = (
    "id", "name", "key_prefix", "status", "permissions", "default_workspace", "allowed_workspaces",
    "default_mode", "daily_limit", "fragment_limit", "symbolic_hard_gate", "created_at", "last_used_at",
)


async def list_keys(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(
        f"""
        SELECT {', '.join('k.' + c for c in KEY_PUBLIC)},
               (SELECT count(*) FROM fragments f WHERE f.key_id = k.id) AS fragment_count,
               COALESCE((SELECT u.calls FROM api_key_daily_usage u
                         WHERE u.key_id = k.id AND u.day = (now() AT TIME ZONE 'UTC')::date), 0) AS calls_today,
               ARRAY(SELECT g.id FROM key_group_members m JOIN key_groups g ON g.id = m.group_id
                     WHERE m.key_id = k.id ORDER BY g.name) AS group_ids
        FROM api_keys k ORDER BY k.created_at, k.id
        """
    )


async def get_key(conn: asyncpg.Connection, key_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {', '.join(KEY_PUBLIC)} FROM api_keys WHERE id = $1", key_id)


async def update_key(conn: asyncpg.Connection, key_id: str, **fields: Any) -> asyncpg.Record | None:
    unknown = set(fields) - set(KEY_SETTABLE)
    if unknown:
        raise ValueError(f"not settable: {sorted(unknown)}")
    if not fields:
        return await get_key(conn, key_id)
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(fields, start=2))
    return await conn.fetchrow(
        f"UPDATE api_keys SET {sets} WHERE id = $1 RETURNING {', '.join(KEY_PUBLIC)}", key_id, *fields.values()
    )


async def delete_key(conn: asyncpg.Connection, key_id: str) -> bool:
    return await conn.fetchval("DELETE FROM api_keys WHERE id = $1 RETURNING true", key_id) is not None


async def count_call(conn: asyncpg.Connection, key_id: str) -> int:
    """Count one tool call against today's (UTC) usage; returns the calls made today."""
    return int(
        await conn.fetchval(
            """
            INSERT INTO api_key_daily_usage (key_id, day, calls) VALUES ($1, (now() AT TIME ZONE 'UTC')::date, 1)
            ON CONFLICT (key_id, day) DO UPDATE SET calls = api_key_daily_usage.calls + 1
            RETURNING calls
            """,
            key_id,
        )
    )


async def add_calls(conn: asyncpg.Connection, key_id: str, day: date, calls: int) -> int:
    """Add calls counted elsewhere (the gateway's Redis counter) to a day's usage; returns the total."""
    return int(
        await conn.fetchval(
            """
            INSERT INTO api_key_daily_usage (key_id, day, calls) VALUES ($1, $2, $3)
            ON CONFLICT (key_id, day) DO UPDATE SET calls = api_key_daily_usage.calls + EXCLUDED.calls
            RETURNING calls
            """,
            key_id, day, calls,
        )
    )


async def calls_on(conn: asyncpg.Connection, key_id: str, day: date) -> int:
    return int(await conn.fetchval("SELECT COALESCE(max(calls), 0) FROM api_key_daily_usage WHERE key_id = $1 AND day = $2", key_id, day))


async def lock_key(conn: asyncpg.Connection, key_id: str) -> None:
    """Hold the key's row until the caller's transaction ends: writers of one key queue here."""
    await conn.execute("SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE", key_id)


async def touch_used(conn: asyncpg.Connection, key_id: str) -> None:
    await conn.execute("UPDATE api_keys SET last_used_at = now() WHERE id = $1", key_id)


# -- admin: groups -------------------------------------------------------------------
async def list_groups(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(
        """
        SELECT g.id, g.name, g.description, g.created_at,
               (SELECT count(*) FROM key_group_members m WHERE m.group_id = g.id) AS member_count
        FROM key_groups g ORDER BY g.name
        """
    )


async def create_group(conn: asyncpg.Connection, name: str, description: str | None) -> asyncpg.Record | None:
    """None when the name is taken."""
    return await conn.fetchrow(
        """
        INSERT INTO key_groups (id, name, description) VALUES ($1, $2, $3)
        ON CONFLICT (name) DO NOTHING RETURNING id, name, description, created_at
        """,
        secrets.token_hex(8), name, description,
    )


async def delete_group(conn: asyncpg.Connection, group_id: str) -> bool:
    return await conn.fetchval("DELETE FROM key_groups WHERE id = $1 RETURNING true", group_id) is not None


async def group_exists(conn: asyncpg.Connection, group_id: str) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM key_groups WHERE id = $1)", group_id))


async def list_members(conn: asyncpg.Connection, group_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        """
        SELECT k.id, k.name, k.key_prefix, k.status, m.joined_at
        FROM key_group_members m JOIN api_keys k ON k.id = m.key_id
        WHERE m.group_id = $1 ORDER BY m.joined_at, k.id
        """,
        group_id,
    )


async def add_member(conn: asyncpg.Connection, group_id: str, key_id: str) -> bool:
    """False when the key does not exist; adding an existing member is a no-op."""
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = $1)", key_id):
        return False
    await conn.execute(
        "INSERT INTO key_group_members (group_id, key_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", group_id, key_id
    )
    return True


async def remove_member(conn: asyncpg.Connection, group_id: str, key_id: str) -> bool:
    return (
        await conn.fetchval(
            "DELETE FROM key_group_members WHERE group_id = $1 AND key_id = $2 RETURNING true", group_id, key_id
        )
        is not None
    )
