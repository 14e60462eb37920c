"""API keys and key groups."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import asyncpg

from shared.domain.principal import Principal

KEY_PREFIX = "mmcp_"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def generate_raw_key() -> str:
    return f"{KEY_PREFIX}{secrets.token_hex(24)}"


async def principal_for_raw_key(conn: asyncpg.Connection, raw: str) -> Principal | None:
    """The active key with this raw value, with the keys its groups let it read."""
    row = await conn.fetchrow(
        """
        SELECT k.*, ARRAY(
            SELECT DISTINCT m2.key_id FROM key_group_members m1
            JOIN key_group_members m2 ON m2.group_id = m1.group_id
            WHERE m1.key_id = k.id
        ) AS group_key_ids
        FROM api_keys k WHERE k.key_hash = $1 AND k.status = 'active'
        """,
        hash_key(raw),
    )
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
