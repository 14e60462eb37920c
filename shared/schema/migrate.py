"""Versioned SQL migrations: applied in order, each in its own transaction, recorded.

Several processes may start at once (replicas, the dev stack); an advisory lock makes the
run exclusive and a rerun is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources

import asyncpg

logger = logging.getLogger(__name__)

# Arbitrary constant: the advisory lock id Engram's migrator holds while it runs.
_MIGRATION_LOCK_ID = 7_305_128_811


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("shared.schema") / "migrations"
    files = sorted((p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir() if p.name.endswith(".sql"))
    return files


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations; return the versions applied now."""
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK_ID)
    try:
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS public.engram_schema_migrations (
                version     text PRIMARY KEY,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM public.engram_schema_migrations")}
        applied: list[str] = []
        for name, sql in migration_files():
            version = name.removesuffix(".sql")
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO public.engram_schema_migrations (version) VALUES ($1)", version)
            logger.info("applied migration %s", version)
            applied.append(version)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK_ID)


async def migrate(database_url: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()


def main() -> None:
    from shared.settings import CommonSettings

    logging.basicConfig(level=logging.INFO)
    applied = asyncio.run(migrate(CommonSettings().database_url))
    print(f"migrations applied: {applied or 'none (up to date)'}")  # noqa: T201 - a command's answer to its operator


if __name__ == "__main__":
    main()
