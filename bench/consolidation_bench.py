"""The consolidation cycle at 10k and 100k fragments: load with COPY, run cycles until the
bulk-load backlog is drained (the first cycle finds everything new and due for decay; each
cycle stays within its per-stage limits), print per-cycle totals and per-stage time/work
for the first and the steady-state cycle.

    .venv/bin/python -m bench.consolidation_bench [--sizes 10000 100000] [--database-url URL]

Without --database-url an embedded Postgres is started under .data/bench-consolidation.
Texts come from bench/corpus.py. Embeddings: the first --real texts are embedded with the
real model (cached in .data/bench-consolidation/); the others get a real vector of another
corpus text perturbed to cosine ~0.85 with it, so groups hold similar-but-distinct vectors
like a real store (embedding 100k texts takes ~10 min on 2 idle cores, ~1 h on busy ones).
The cycle runs in-process, exactly as the worker runs it (services.maintenance.pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import asyncpg
import numpy as np

from bench.corpus import generate
from services.maintenance.pipeline import CycleContext, run_cycle
from shared.db import SEARCH_PATH, create_pool
from shared.domain.fragment import content_hash
from shared.embeddings import load_embedder
from shared.llm import LLMClient, LLMSettings
from shared.repositories.maintenance import Tenant
from shared.schema.migrate import migrate
from shared.settings import MaintenanceSettings

DATA = Path(".data/bench-consolidation")
KEYS = 10
MAX_CYCLES = 12
# GC deletes its cap (500) every cycle while cold fragments remain; beyond that, a cycle
# that changes this few rows has no backlog left.
STEADY_WRITES = 1_000


def embeddings(texts: list[str], real: int) -> np.ndarray:
    DATA.mkdir(parents=True, exist_ok=True)
    cache = DATA / f"real-{real}.npy"
    if cache.exists():
        base = np.load(cache)
    else:
        base = load_embedder().embed(texts[:real]).astype(np.float32)
        np.save(cache, base)
    rng = np.random.default_rng(3)
    out = np.empty((len(texts), base.shape[1]), dtype=np.float32)
    out[: len(base)] = base[: len(texts)]
    for start in range(len(base), len(texts), 10_000):
        n = min(10_000, len(texts) - start)
        picks = base[rng.integers(0, len(base), n)]
        # noise of norm ~0.62 against a unit vector: cosine to the original ~0.85.
        noise = rng.normal(0, 0.62 / np.sqrt(base.shape[1]), size=picks.shape).astype(np.float32)
        mixed = picks + noise
        out[start:start + n] = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
    return out


async def load(conn: asyncpg.Connection, n: int, real: int) -> tuple[int, float]:
    memories = generate(n)
    texts = [m.fragment["content"] for m in memories]
    began = time.perf_counter()
    vectors = embeddings(texts, min(real, n))
    embed_s = time.perf_counter() - began
    run = uuid.uuid4().hex[:6]
    keys = [f"bench-{run}-{i}" for i in range(KEYS)]
    await conn.executemany(
        "INSERT INTO api_keys (id, name, key_hash, key_prefix) VALUES ($1, $1, $1, 'bench')", [(k,) for k in keys]
    )
    rng = random.Random(5)
    now = datetime.now(timezone.utc)
    records = []
    for i, m in enumerate(memories):
        f = m.fragment
        key = None if i % (KEYS + 1) == KEYS else keys[i % (KEYS + 1)]
        content = f["content"]
        if i % 50 == 49:  # 2 % exact duplicates of the previous fragment of the same tenant
            content = memories[i - (KEYS + 1)].fragment["content"] if i >= KEYS + 1 else content
        created = now - timedelta(days=rng.uniform(0, 400))
        accessed = created + timedelta(days=rng.uniform(0, (now - created).days + 0.01)) if rng.random() < 0.4 else None
        vector = None if i % 500 == 7 else vectors[i]  # 0.2 % without an embedding (backfill)
        records.append((
            f"frag-b{run}{i:07d}", content, f["topic"], f["type"], f["keywords"], float(f["importance"]),
            rng.random() < 0.02, key, f"{f['workspace']}", content_hash(content), vector, created, created,
            rng.choice((0, 0, 0, 1, 2, 5, 12)) if accessed else 0, accessed,
            round(rng.random(), 3) if accessed else 0.0,
        ))
    # Bulk load: building the HNSW graphs (the whole table's and each type's) once after COPY
    # is several times faster than inserting 100k vectors into them one by one.
    graphs = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        " AND tablename = 'fragments' AND indexdef ILIKE '%USING hnsw%'"
    )
    for graph in graphs:
        await conn.execute(f"DROP INDEX {graph['indexname']}")
    await conn.copy_records_to_table(
        "fragments", schema_name="agent_memory",
        columns=["id", "content", "topic", "type", "keywords", "importance", "is_anchor", "key_id", "workspace",
                 "content_hash", "embedding", "created_at", "valid_from", "access_count", "last_accessed_at",
                 "ema_activation"],
        records=records,
    )
    await conn.execute("SET maintenance_work_mem = '512MB'")
    for graph in graphs:
        await conn.execute(graph["indexdef"])
    ids = [r[0] for r in records]
    owners = [r[7] for r in records]
    events = []
    for _ in range(n // 20):
        j = rng.randrange(len(ids) - 40)
        owner = owners[j]
        same = [ids[k] for k in range(j, j + 40) if owners[k] == owner][:5]
        events.append((owner, "text", same, len(same)))
    await conn.executemany(
        "INSERT INTO search_events (key_id, query_type, result_ids, result_count) VALUES ($1, $2, $3, $4)", events
    )
    await conn.executemany(
        "INSERT INTO sessions (id, key_id, last_activity_at) VALUES ($1, $2, now() - make_interval(hours => $3))",
        [(f"bench-{run}-s{i}", keys[i % KEYS], rng.randrange(0, 72)) for i in range(n // 100)],
    )
    await conn.execute("ANALYZE fragments")
    return len(records), embed_s


def _row(name: str, stage: dict) -> str:
    work = stage.get("processed", stage.get("skipped", "-"))
    extra = ""
    if "blockedBySafetyGate" in stage:
        extra = f"blocked by gate {stage['blockedBySafetyGate']}, as contradiction {stage['blockedAsContradiction']}"
    if "error" in stage:
        extra = stage["error"][:60]
    return f"  {name:<20} {stage.get('durationMs', 0):>9.0f} ms  {str(work):>8}  {extra}"


async def bench(database_url: str, sizes: list[int], real: int) -> None:
    settings = MaintenanceSettings()
    llm = LLMClient(LLMSettings(LLM_BASE_URL=None, LLM_MODEL=None))  # the cycle as run with no LLM
    for n in sizes:
        conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
        from pgvector.asyncpg import register_vector

        await register_vector(conn)
        await conn.execute("TRUNCATE fragments, search_events, sessions, maintenance_runs, consolidation_marks CASCADE")
        began = time.perf_counter()
        loaded, embed_s = await load(conn, n, real)
        print(f"\n{loaded} fragments loaded in {time.perf_counter() - began:.1f} s (embeddings {embed_s:.1f} s)")
        await conn.close()
        pool = await create_pool(database_url, min_size=1, max_size=4)
        try:
            # A bulk-loaded store is all backlog (everything due for decay, every group new):
            # cycles drain it within their per-stage limits; the last cycle is steady state.
            for cycle in range(1, MAX_CYCLES + 1):
                ctx = CycleContext(pool=pool, tenant=Tenant(), settings=settings, llm=llm, budget=llm.budget(),
                                   embedder=load_embedder)
                began = time.perf_counter()
                report = await run_cycle(ctx)
                total = time.perf_counter() - began
                writes = sum(int(st.get("processed", 0) or 0) for st in report["stages"].values())
                print(f"{n} fragments, cycle {cycle}: {total:.1f} s, {writes} rows changed")
                if cycle == 1 or writes <= STEADY_WRITES or cycle == MAX_CYCLES:
                    for name, stage in report["stages"].items():
                        print(_row(name, stage))
                if writes <= STEADY_WRITES:
                    break
        finally:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--real", type=int, default=3_000, help="texts embedded with the real model")
    parser.add_argument("--database-url")
    args = parser.parse_args()
    if args.database_url:
        asyncio.run(migrate(args.database_url))
        asyncio.run(bench(args.database_url, args.sizes, args.real))
        return
    from services.stack.postgres import EmbeddedPostgres
    from services.stack.supervisor import free_port

    pg = EmbeddedPostgres((DATA / "pg").resolve(), free_port())
    pg.start()
    try:
        asyncio.run(migrate(pg.url))
        asyncio.run(bench(pg.url, args.sizes, args.real))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
