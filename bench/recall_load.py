"""Recall at scale without waiting on the write path: bulk-load N corpus fragments straight
into a running stack's database (real MiniLM embeddings, the repository's own insert), then
time recall end to end through MCP with bench.recall_bench's query suites.

    python -m bench.recall_load --url URL --key KEY --database-url DSN [--n 100000] [--queries 300]

Loading through batch_remember measures ingest (bench/ingest_bench.py); this bench is about
the read path at 100k, so it skips the gateway for the load only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

from bench.corpus import filtered_queries, generate, keyword_queries, text_queries
from bench.harness import LATENCY_HEADER, Target, latency_row, print_table
from bench.loading import run_namespace, scoped, stack_cpu_by_process
from bench.recall_bench import WARMUP, time_queries
from shared.db import SEARCH_PATH
from shared.domain.fragment import NewFragment
from shared.domain.keywords import merge_keywords
from shared.domain.passages import passages
from shared.embeddings import load_embedder
from shared.repositories import fragments as fragments_repo

# Rows per insert transaction and per embedding call (the embedder cuts it into EMBEDDING_BATCH_SIZE runs).
CHUNK = 2000


def _vectors(embedder, texts: list[str], share: float, rng: np.random.Generator, pool: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Real embeddings for `share` of the texts; the rest are real ones from this run
    perturbed and renormalised (same clustered distribution, no model time)."""
    real_n = max(1, int(len(texts) * share)) if share < 1 or not pool else len(texts)
    real = list(embedder.embed(texts[:real_n]))
    pool.extend(real[:200])
    out = real
    for _ in texts[real_n:]:
        out.append(_near(pool[int(rng.integers(len(pool)))], 0.03, rng))
    return out


def _near(base: np.ndarray, spread: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector near `base`: the same clustered distribution as real ones, no model time."""
    v = base + rng.normal(0, spread, base.shape).astype(np.float32)
    return v / np.linalg.norm(v)


def _passage_vectors(content: str, vector: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Rows for the fragment's passages as a write would store them (how many is what recall's
    cost depends on); their vectors are the fragment's perturbed, without model time."""
    return [_near(vector, 0.05, rng) for _ in passages(content)]


async def bulk_load(database_url: str, memories: list, namespace: str, embed_share: float) -> tuple[list[str], float]:
    embedder = load_embedder()
    rng = np.random.default_rng(7)
    pool: list[np.ndarray] = []
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    await register_vector(conn)
    session = f"bench-{uuid.uuid4().hex[:8]}"
    ids: list[str] = []
    began = time.perf_counter()
    try:
        for start in range(0, len(memories), CHUNK):
            chunk = [scoped(m.fragment, namespace) for m in memories[start:start + CHUNK]]
            vectors = await asyncio.to_thread(_vectors, embedder, [f["content"] for f in chunk], embed_share, rng, pool)
            rows = []
            for f, vec in zip(chunk, vectors):
                fid = f"frag-{uuid.uuid4().hex[:16]}"
                ids.append(fid)
                rows.append(NewFragment(
                    id=fid, content=f["content"], topic=f["topic"], type=f["type"],
                    keywords=merge_keywords(f.get("keywords"), f["content"]), importance=f["importance"],
                    content_hash=hashlib.sha256(f["content"].encode()).hexdigest(), embedding=vec,
                    passage_embeddings=_passage_vectors(f["content"], vec, rng),
                    workspace=f["workspace"], workspace_source="explicit", session_id=session,
                ))
            async with conn.transaction():
                await fragments_repo.insert_many(conn, rows)
                # No automatic links for synthetic rows: the worker's link sweep would work
                # through 100k of them while recall is being timed.
                await conn.execute(
                    "DELETE FROM fragment_link_pending WHERE fragment_id = ANY($1::text[])", [r.id for r in rows]
                )
            print(f"  loaded {start + len(chunk)}/{len(memories)} ({time.perf_counter() - began:.0f} s)", flush=True)
        for table in ("fragments", "fragment_terms", "fragment_passages"):
            await conn.execute(f"ANALYZE {table}")
    finally:
        await conn.close()
    return ids, time.perf_counter() - began


async def loaded_ids(database_url: str, memories: list, namespace: str, cache: Path | None = None) -> list[str | None]:
    """Ids of an earlier load of the same corpus (same seed) under `namespace`.

    Matching them reads every loaded row's content, a scan of the whole heap (8-13 GB at 1M),
    which pushes the indexes out of the page cache right before the timed queries: kept in
    `cache` after the first pass, later passes time recall, not the harness's own scan."""
    if cache is not None and cache.exists():
        return list(json.loads(cache.read_text()))
    conn = await asyncpg.connect(database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        rows = await conn.fetch("SELECT id, workspace, content FROM fragments WHERE workspace LIKE $1 || '-%'", namespace)
    finally:
        await conn.close()
    by_key = {(r["workspace"], r["content"]): r["id"] for r in rows}
    ids = [by_key.get((scoped(m.fragment, namespace)["workspace"], m.fragment["content"])) for m in memories]
    if cache is not None:
        cache.write_text(json.dumps(ids))
    return ids


def ids_cache(namespace: str, n: int, seed: int) -> Path:
    """Where loaded_ids keeps a load's ids: the corpus is generate(n, seed) under `namespace`."""
    return Path(tempfile.gettempdir()) / f"engram-bench-ids-{namespace}-{n}-{seed}.json"


CPU_KINDS = ("postgres", "recall", "gateway", "redis")
CPU_HEADER = ["case", *CPU_KINDS, "other", "stack", "client"]


def cpu_row(name: str, before: dict[str, float], after: dict[str, float], client: float, count: int) -> list[str]:
    """One suite's CPU per query: the stack's processes by kind between two readings of
    stack_cpu_by_process, and this (client) process's."""
    spent = {kind: after.get(kind, 0.0) - before.get(kind, 0.0) for kind in after}
    other = sum(seconds for kind, seconds in spent.items() if kind not in CPU_KINDS)
    cells = [spent.get(kind, 0.0) for kind in CPU_KINDS] + [other, sum(spent.values()), client]
    return [name, *(f"{seconds / count * 1000:.1f}" for seconds in cells)]


async def run(
    target: Target, database_url: str, n: int, count: int, seed: int, embed_share: float, reuse: str | None,
    query_seed: int | None = None,
) -> None:
    memories = generate(n, seed=seed)
    qs = seed if query_seed is None else query_seed
    if reuse:
        namespace = reuse
        ids = await loaded_ids(database_url, memories, namespace, ids_cache(namespace, n, seed))
        print(f"reusing {sum(1 for i in ids if i)} fragments of {namespace}", flush=True)
    else:
        namespace = run_namespace(f"recall{n}")
        ids, seconds = await bulk_load(database_url, memories, namespace, embed_share)
        print(f"bulk-loaded {n} fragments into {namespace} in {seconds:.0f} s ({embed_share:.0%} embedded by the model)", flush=True)
    suites = {
        "text": text_queries(memories, WARMUP + count, seed=qs + 1),
        "keyword": keyword_queries(memories, WARMUP + count, seed=qs + 2),
        "filtered (ws+type+minImportance)": filtered_queries(memories, WARMUP + count, seed=qs + 3),
    }
    rows, cpu_rows = [], []
    for name, queries in suites.items():
        await time_queries(target, queries[:WARMUP], namespace, ids)
        before, client_before = stack_cpu_by_process(database_url), time.process_time()
        began = time.perf_counter()
        samples, hit_rate = await time_queries(target, queries[WARMUP:], namespace, ids)
        qps = len(samples) / (time.perf_counter() - began)
        client = time.process_time() - client_before
        rows.append(latency_row(name, samples, f"hit@10 {hit_rate:.2f}, {qps:.0f} q/s"))
        if before and samples:
            cpu_rows.append(cpu_row(name, before, stack_cpu_by_process(database_url), client, len(samples)))
    print_table(
        f"recall over MCP at {n} fragments (one client, sequential, pageSize 10, after {WARMUP} warm-up each)",
        LATENCY_HEADER, rows,
    )
    if cpu_rows:
        print_table(
            "CPU per recall by process, ms (the stack's processes by /proc, reaped Postgres backends included; client:"
            " this process, the MCP client library's own)", CPU_HEADER, cpu_rows,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--query-seed", type=int,
                        help="sample the queries with this seed instead of --seed: other questions about the same stored corpus")
    parser.add_argument("--embed-share", type=float, default=1.0,
                        help="share of fragments the model embeds; the rest get perturbed copies (faster load, "
                             "same vector distribution; hit@10 then only counts for model-embedded targets)")
    parser.add_argument("--reuse", metavar="NAMESPACE", help="time queries against an earlier load instead of loading")
    args = parser.parse_args()
    asyncio.run(run(
        Target(args.url, args.key), args.database_url, args.n, args.queries, args.seed, args.embed_share, args.reuse, args.query_seed,
    ))


if __name__ == "__main__":
    main()
