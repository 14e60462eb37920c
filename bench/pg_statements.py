"""Which statements a load spends Postgres' time on: pg_stat_statements reset, a command run (a
bench pass, say), then the statements by total execution time, per call and per unit of the load.

    python -m bench.pg_statements --database-url DSN [--per N] [--top 20] [-- CMD ...]

The stack's Postgres must preload the library: start it with ENGRAM_PG_STAT_STATEMENTS=1
(services/stack/postgres.py). The extension is created in the database if it is missing. Without
CMD the statistics gathered so far are printed and nothing is reset. `--per N` divides the
totals by N (the calls of the pass, e.g. 540 for `bench.recall_load --queries 150`: three suites
of 150 after 30 warm-ups each) to give a column per recall. Execution time only: parse, plan
(unless pg_stat_statements.track_planning is on) and the protocol's own work are not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess

import asyncpg

from bench.harness import print_table

STATEMENTS = """
    SELECT calls, total_exec_time, mean_exec_time, shared_blks_read, rows,
           left(regexp_replace(query, '\\s+', ' ', 'g'), $1) AS query
    FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY total_exec_time DESC
"""


async def _connect(database_url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(database_url)
    if not await conn.fetchval("SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))"):
        await conn.close()
        raise SystemExit("pg_stat_statements is not preloaded: start the stack with ENGRAM_PG_STAT_STATEMENTS=1")
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return conn


async def run(database_url: str, command: list[str], per: int, top: int, width: int) -> None:
    conn = await _connect(database_url)
    try:
        if command:
            await conn.execute("SELECT pg_stat_statements_reset()")
            await asyncio.to_thread(subprocess.run, command, check=True)
        rows = await conn.fetch(STATEMENTS, width)
    finally:
        await conn.close()
    total = sum(r["total_exec_time"] for r in rows)
    calls = sum(r["calls"] for r in rows)
    unit = f"ms / {per}" if per > 1 else "ms total"
    title = (f"Postgres execution time by statement: {total:.0f} ms in {calls} calls of {len(rows)} statements"
             + (f"; {total / per:.2f} ms and {calls / per:.1f} calls per unit (1/{per} of the load)" if per > 1 else ""))
    print_table(
        title,
        ["calls", unit, "share", "mean ms", "rows/call", "blocks read", "statement"],
        [[r["calls"], f"{r['total_exec_time'] / per:.2f}", f"{r['total_exec_time'] / total:.0%}" if total else "-",
          f"{r['mean_exec_time']:.3f}", f"{r['rows'] / r['calls']:.1f}" if r["calls"] else "-", r["shared_blks_read"], r["query"]]
         for r in rows[:top]],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--per", type=int, default=1, help="divide the totals by this (the load's calls)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--width", type=int, default=110, help="characters of each statement shown")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the load to run (its output passes through)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    asyncio.run(run(args.database_url, command, max(args.per, 1), args.top, args.width))


if __name__ == "__main__":
    main()
