"""The consolidation cycle as a declarative list of stages.

Each stage has a name (its flag: CONSOLIDATE_DISABLED_STAGES switches it off), a bound on
the work it does per run, and its own metrics. Each runs in its own transaction, so a
failing stage leaves the others' work committed and is reported, not fatal. Every stage is
idempotent: a rerun finds nothing left to do (decay counts from last_decay_at, dedup only
compares unconsolidated fragments, links use ON CONFLICT).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import Counter, Histogram

from services.maintenance.similarity import SimilarPair, similar_pairs
from shared.domain.autoreflect import same_session_reflections
from shared.domain.dedup import CONTRADICTION_MIN, SEMANTIC_DUPLICATE_MIN, contradiction_signal, decide_merge
from shared.domain.passages import embedding_inputs, passages, split_vectors
from shared.embeddings import Embedder
from shared.llm import LLMBudget, LLMClient
from shared.repositories import consolidation as repo
from shared.repositories.maintenance import Tenant
from shared.settings import MaintenanceSettings

logger = logging.getLogger(__name__)

STAGE_ITEMS = Counter("engram_consolidation_stage_items_total", "Items a consolidation stage changed", ["stage"])
STAGE_SECONDS = Histogram(
    "engram_consolidation_stage_seconds", "Duration of a consolidation stage", ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
STAGE_FAILURES = Counter("engram_consolidation_stage_failures_total", "Consolidation stages that failed", ["stage"])


@dataclass
class CycleContext:
    pool: asyncpg.Pool
    tenant: Tenant
    settings: MaintenanceSettings
    llm: LLMClient
    budget: LLMBudget
    embedder: Callable[[], Embedder]
    # Filled by the similarity scan, read by the dedup / contradiction stages.
    _pairs: list[SimilarPair] | None = None
    _groups: list[tuple[str | None, str | None, str]] = field(default_factory=list)
    merged_away: set[str] = field(default_factory=set)
    # A pair stage stopped at its limit: the groups' marks must not advance, or the pairs it
    # did not reach would never be compared again.
    capped: bool = False
    # New fragments one cycle compares with their groups (their groups' marks then advance).
    scan_limit: int = 10_000

    async def pairs(self) -> list[SimilarPair]:
        """One similarity scan per cycle, shared by the stages that need it."""
        if self._pairs is None:
            async with self.pool.acquire() as conn:
                self._groups = await repo.unconsolidated_groups(conn, self.tenant, self.scan_limit)
                rows = await repo.group_members(conn, self._groups)
            self._pairs, _ = similar_pairs(rows, CONTRADICTION_MIN)
        return self._pairs


StageFn = Callable[[CycleContext, asyncpg.Connection, int], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    # Bound on the rows one run of this stage changes (or examines, for scans).
    limit: int
    description: str


async def _tiers(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.transition_tiers(conn, ctx.tenant, limit)


async def _decay(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.decay_importance(conn, ctx.tenant, limit)


async def _gc(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.collect_garbage(conn, ctx.tenant, limit)


async def _exact(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    pairs = await repo.exact_duplicate_pairs(conn, ctx.tenant, limit)
    merged = await repo.merge_into(conn, pairs)
    ctx.merged_away.update(p[0] for p in pairs)
    return {"processed": merged, "merged": [{"id": r, "into": s} for r, s in pairs[:20]]}


async def _semantic(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    merges: list[tuple[str, str]] = []
    blocked: list[dict[str, Any]] = []
    examined = 0
    for pair in await ctx.pairs():
        if pair.similarity < SEMANTIC_DUPLICATE_MIN:
            break  # pairs are sorted by similarity
        if pair.a["id"] in ctx.merged_away or pair.b["id"] in ctx.merged_away:
            continue
        examined += 1
        decision = decide_merge(dict(pair.a), dict(pair.b))
        if not decision.allowed:
            blocked.append({"ids": [decision.removed, decision.survivor], "missing": list(decision.missing),
                            "similarity": round(pair.similarity, 4)})
            continue
        conflict = contradiction_signal(pair.a["content"], pair.b["content"])
        if conflict is not None:
            # "enabled" vs "disabled" embed at 0.94: near-identical text, opposite facts.
            blocked.append({"ids": [pair.a["id"], pair.b["id"]], "contradiction": conflict.signal,
                            "similarity": round(pair.similarity, 4)})
            continue
        merges.append((decision.removed, decision.survivor))
        ctx.merged_away.add(decision.removed)
        if len(merges) >= limit:
            ctx.capped = True
            break
    merged = await repo.merge_into(conn, merges)
    return {
        "processed": merged,
        "examined": examined,
        "merged": [{"id": r, "into": s} for r, s in merges[:20]],
        "blockedBySafetyGate": sum(1 for b in blocked if "missing" in b),
        "blockedAsContradiction": sum(1 for b in blocked if "contradiction" in b),
        "blocked": blocked[:20],
    }


_CONTRADICTION_SYSTEM = (
    "You compare two short memory statements from the same project and topic. Answer with "
    "exactly one word: CONTRADICT if both cannot be true at the same time, otherwise COMPATIBLE."
)
# The band where no deterministic signal fired but the pair is close enough to ask an LLM.
LLM_CONTRADICTION_BAND = (0.85, SEMANTIC_DUPLICATE_MIN)


async def _contradictions(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    links: list[tuple[str, str, float]] = []
    signals: dict[str, int] = {}
    for pair in await ctx.pairs():
        if len(links) >= limit:
            ctx.capped = True
            break
        a, b = pair.a, pair.b
        if a["id"] in ctx.merged_away or b["id"] in ctx.merged_away or same_session_reflections(a, b):
            continue
        found = contradiction_signal(a["content"], b["content"])
        if found is not None:
            links.append((a["id"], b["id"], found.confidence))
            signals[found.signal] = signals.get(found.signal, 0) + 1
            continue
        low, high = LLM_CONTRADICTION_BAND
        if ctx.llm.configured and low <= pair.similarity < high:
            answer = ctx.llm.complete(_CONTRADICTION_SYSTEM, f"A: {a['content']}\nB: {b['content']}", ctx.budget, max_tokens=5)
            if answer and answer.strip().upper().startswith("CONTRADICT"):
                links.append((a["id"], b["id"], 0.6))
                signals["llm"] = signals.get("llm", 0) + 1
    created = await repo.insert_contradictions(conn, links)
    return {"processed": created, "signals": signals, "links": [{"from": x, "to": y, "confidence": w} for x, y, w in links[:20]]}


async def _supersede(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.supersede_contradicted(conn, ctx.tenant, limit)


# Embedding batch of 64: the ONNX model's throughput flattens above it on 2 cores.
EMBED_BATCH = 64


async def _backfill(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    todo = await repo.missing_embeddings(conn, ctx.tenant, limit)
    if not todo:
        return {"processed": 0}
    embedder = ctx.embedder()
    stored = 0
    for start in range(0, len(todo), EMBED_BATCH):
        chunk = todo[start:start + EMBED_BATCH]
        # The same text a write embeds (topic and content), so a backfilled fragment ranks as
        # it would have had the model been there when it was stored.
        texts, spans = embedding_inputs([(topic, content) for _, topic, content in chunk])
        stored += await repo.store_embeddings(conn, [i for i, _, _ in chunk], split_vectors(embedder.embed(texts), spans))
    return {"processed": stored}


async def _passage_backfill(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    """Passages for fragments stored before they existed (queued once by migration 0012).
    Everything is embedded before anything is written, so the rows are locked only for the
    one write at the end."""
    todo = await repo.passage_backlog(conn, ctx.tenant, limit)
    if not todo:
        return {"processed": 0}
    parts = [passages(content) for _, content in todo]
    texts = [text for part in parts for text in part]
    vectors = []
    if texts:
        embedder = ctx.embedder()
        vectors = [v for start in range(0, len(texts), EMBED_BATCH) for v in embedder.embed(texts[start:start + EMBED_BATCH])]
    items, at = [], 0
    for (fid, content), part in zip(todo, parts, strict=True):
        items.append((fid, content, vectors[at:at + len(part)]))
        at += len(part)
    stored = await repo.store_backfilled_passages(conn, items)
    return {"processed": stored, "checked": len(todo)}


async def _activation(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.decay_activation(conn, ctx.tenant, limit)


async def _co_retrieval(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.link_co_retrieved(conn, ctx.tenant, limit)


async def _sessions(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    return await repo.clean_sessions(conn, ctx.tenant, ctx.settings.session_idle_ttl, limit)


# Anomaly rules: (kind, test on a key's facts, the value reported).
def _anomalies(facts: asyncpg.Record) -> list[dict[str, Any]]:
    found = []
    live = max(1, facts["live"])
    daily_avg = facts["last_30_days"] / 30
    if facts["no_embedding"] > 0:
        found.append({"kind": "missing_embeddings", "value": facts["no_embedding"]})
    if facts["open_contradictions"] > 0:
        found.append({"kind": "open_contradictions", "value": facts["open_contradictions"]})
    if facts["live"] >= 20 and facts["very_important"] / live > 0.5:
        found.append({"kind": "importance_inflation", "value": round(facts["very_important"] / live, 3), "threshold": 0.5})
    if facts["last_day"] >= 50 and facts["last_day"] > 5 * max(daily_avg, 1):
        found.append({"kind": "write_burst", "value": facts["last_day"], "dailyAverage": round(daily_avg, 1)})
    if facts["live"] >= 20 and facts["no_keywords"] / live > 0.3:
        found.append({"kind": "missing_keywords", "value": round(facts["no_keywords"] / live, 3), "threshold": 0.3})
    return found


async def _anomaly_scan(ctx: CycleContext, conn: asyncpg.Connection, limit: int) -> dict[str, Any]:
    anomalies = []
    for facts in await repo.anomaly_facts(conn, ctx.tenant):
        for item in _anomalies(facts):
            anomalies.append({"keyId": facts["key_id"], **item})
    return {"processed": len(anomalies), "anomalies": anomalies[:limit]}


# Limits bound each run; a backlog drains over the next cycles. Measured with
# bench/consolidation_bench.py on 2 busy cores at 100k fragments: a row rewrite costs
# ~1-1.5 ms (mostly the HNSW insert of a non-HOT update), so 10k rewrites per row-writing
# stage keep a backlog cycle under a minute while a steady-state cycle takes ~9 s.
STAGES: tuple[Stage, ...] = (
    Stage("embedding_backfill", _backfill, 2_000, "embed fragments stored without an embedding"),
    # Measured: 735 LoCoMo turns (1,340 passages) in 4.4 s on the AVX-512 machine, so a run of
    # 2,000 is ~12 s there and ~3x that on an AVX2-only CPU.
    Stage("passage_backfill", _passage_backfill, 2_000, "embed the passages of fragments stored before passages existed"),
    # Decay before tiers: the tier rules read the decayed importance, so a rerun is a no-op.
    Stage("importance_decay", _decay, 10_000, "decay importance by type half-life since last decay; anchors exempt"),
    Stage("activation_decay", _activation, 10_000, "decay ema_activation since last decay or access"),
    Stage("ttl_tiers", _tiers, 10_000, "move fragments between hot / warm / cold / permanent"),
    Stage("expiry_gc", _gc, 500, "delete cold, idle, low-utility fragments past the grace period"),
    Stage("exact_dedup", _exact, 5_000, "merge live fragments with identical content (same key, workspace)"),
    Stage("semantic_dedup", _semantic, 2_000, "merge near-duplicates within key+workspace+topic behind the safety gate"),
    Stage("contradictions", _contradictions, 2_000, "link conflicting statements with contradicts"),
    Stage("supersession", _supersede, 1_000, "newer contradicting decisions/preferences supersede older ones"),
    Stage("co_retrieval", _co_retrieval, 5_000, "co_retrieved links from recent search events"),
    Stage("session_cleanup", _sessions, 1_000, "end idle sessions, drop old reflected ones"),
    Stage("anomalies", _anomaly_scan, 200, "per-tenant anomalies for the admin view"),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


async def run_cycle(
    ctx: CycleContext, only: list[str] | None = None,
    progress: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run the enabled stages in order; returns the per-stage report. `progress` hears of each
    stage as it starts and ends (the run row's progress, which the admin runs routes show)."""
    report: dict[str, Any] = {"tenant": ctx.tenant.label, "stages": {}}
    failed: list[str] = []
    planned = [s.name for s in STAGES if only is None or s.name in only]
    for stage in STAGES:
        if progress is not None and stage.name in planned:
            finished = {name: {k: v for k, v in r.items() if k in ("processed", "durationMs", "skipped", "error")}
                        for name, r in report["stages"].items()}
            await progress({"stage": stage.name, "done": planned.index(stage.name), "total": len(planned), "stages": finished})
        if only is not None and stage.name not in only:
            continue
        if stage.name in ctx.settings.disabled_stages:
            report["stages"][stage.name] = {"skipped": "disabled"}
            continue
        began = time.perf_counter()
        try:
            async with ctx.pool.acquire() as conn, conn.transaction():
                result = await stage.run(ctx, conn, stage.limit)
        except asyncpg.PostgresConnectionError:
            raise  # the connection is gone: the task retries with backoff
        except (asyncpg.PostgresError, ValueError, RuntimeError) as exc:
            # One stage's failure is reported and the cycle goes on.
            logger.exception("consolidation stage %s failed", stage.name)
            STAGE_FAILURES.labels(stage.name).inc()
            failed.append(stage.name)
            result = {"error": f"{exc.__class__.__name__}: {exc}"}
        elapsed = time.perf_counter() - began
        STAGE_SECONDS.labels(stage.name).observe(elapsed)
        STAGE_ITEMS.labels(stage.name).inc(int(result.get("processed", 0) or 0))
        result["limit"] = stage.limit
        result["durationMs"] = round(elapsed * 1000, 1)
        report["stages"][stage.name] = result
    if ctx._pairs is not None and not failed and not ctx.capped:
        # Compared this cycle: later cycles compare only what is newer than the marks.
        async with ctx.pool.acquire() as conn:
            await repo.advance_marks(conn, ctx._groups)
    report["failedStages"] = failed
    report.update(ctx.budget.report())
    return report
