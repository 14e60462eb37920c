"""The memory REST API's model-free and model passes (reference 001): lexical consolidation of
one namespace, the LLM consolidation of every eligible namespace and its status, extraction
from a transcript, and ensure-model-available.

"The router" of the reference is Engram's optional OpenAI-compatible LLM (shared/llm.py,
LLM_BASE_URL + LLM_MODEL): extract and consolidation/run answer 503 without one, after
their own input checks (extract's 400s come first). Manual entries are never touched, and
agent-experience banks never consolidated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import numpy as np

from services.common.internal import ToolContext
from services.ingest.memory_api import (
    check_entry_fields,
    namespace_uuid,
    new_entry,
    screened,
)
from services.ingest.service import WriteResources, after_commit, invalidate_recall_cache
from shared.domain import memory_banks as banks
from shared.domain.memory_banks import MemoryApiError, not_found
from shared.domain.principal import Principal
from shared.jobs import LINK_TASK
from shared.llm import LLMBudget, LLMClient, load_llm
from shared.repositories import memory_consolidation as status_repo
from shared.repositories import memory_entries as entries_repo
from shared.repositories import namespaces as ns_repo
from shared.repositories.fragments import content_morphemes

ROUTER_DOWN = "no LLM is configured (LLM_BASE_URL, LLM_MODEL): the model router is not running"
# The LLM pass: auto entries this similar (MiniLM cosine) form one cluster to rewrite.
LLM_CLUSTER_COSINE = 0.85
# Where extraction stores what it finds unless config.namespaceId names a namespace.
EXTRACTED_NAMESPACE = "Extracted memories"
EXTRACT_SYSTEM = (
    "You extract durable facts worth remembering across conversations (preferences, project "
    "conventions, domain facts) from a chat transcript. Answer with one fact per line, each a "
    "short self-contained sentence, and nothing else. Answer NONE when nothing is worth saving."
)
CONSOLIDATE_SYSTEM = (
    "You merge near-duplicate memory entries into one canonical fact. Answer with that single "
    "sentence only, keeping every detail the entries agree on."
)


def _router() -> LLMClient:
    llm = load_llm()
    if not llm.configured:
        raise MemoryApiError(503, ROUTER_DOWN)
    return llm


async def _complete(llm: LLMClient, system: str, prompt: str, budget: LLMBudget) -> str | None:
    return await anyio.to_thread.run_sync(lambda: llm.complete(system, prompt, budget, max_tokens=800))


# -- lexical consolidation ------------------------------------------------------------------


def _config(args: dict[str, Any]) -> tuple[float, int]:
    config = args.get("config") or {}
    threshold = config.get("similarityThreshold")
    if threshold is None:
        threshold = banks.SIMILARITY_DEFAULT
    if not 0.0 <= float(threshold) <= 1.0:
        raise MemoryApiError(400, "similarityThreshold must be between 0.0 and 1.0")
    max_age = config.get("maxEntryAgeDays")
    if max_age is None:
        max_age = banks.MAX_AGE_DAYS_DEFAULT
    if int(max_age) < 0:
        raise MemoryApiError(400, "maxEntryAgeDays must not be negative")
    return float(threshold), int(max_age)


def lexical_clusters(rows: list[Any], threshold: float) -> list[list[Any]]:
    """Greedy single pass, newest first: an entry joins the first cluster whose newest entry
    it is at least `threshold` similar to (word Jaccard), else starts its own."""
    clusters: list[tuple[frozenset[str], list[Any]]] = []
    for row in rows:
        words = banks.word_set(row["content"])
        for head, members in clusters:
            if banks.jaccard(head, words) >= threshold:
                members.append(row)
                break
        else:
            clusters.append((words, [row]))
    return [members for _, members in clusters]


async def consolidate_namespace(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Prunes auto entries not updated for maxEntryAgeDays, then merges near-duplicates: the
    newest of a cluster stays, with every member's tags and metadata; the others go. Only
    the namespace's 500 most recently updated auto entries are read (pairwise cost)."""
    threshold, max_age = _config(args)
    now = datetime.now(UTC)
    async with res.pool.acquire() as conn, conn.transaction():
        namespace = await ns_repo.get_namespace(conn, ctx.principal.writes, namespace_uuid(args["namespaceId"]), lock=True)
        if namespace is None:
            raise not_found("namespace")
        if banks.consolidation_protected(namespace["name"], namespace["description"]):
            raise MemoryApiError(400, "agent-experience namespaces are not consolidated")
        rows = await entries_repo.newest_auto(conn, ctx.principal.writes, namespace["id"], banks.CONSOLIDATE_WINDOW)
        cutoff = now - timedelta(days=max_age)
        stale = [r["id"] for r in rows if r["updated_at"] < cutoff]
        fresh = [r for r in rows if r["updated_at"] >= cutoff]
        merged = removed = 0
        gone: list[str] = list(stale)
        for cluster in lexical_clusters(fresh, threshold):
            if len(cluster) < 2:
                continue
            keeper, absorbed = cluster[0], cluster[1:]
            tags = list(dict.fromkeys(t for r in cluster for t in (r["keywords"] or [])))[: banks.TAGS_MAX]
            metadata: dict[str, Any] = {}
            for r in reversed(cluster):  # the newest entry's values win
                metadata.update(entries_repo.metadata_of(r["metadata"]))
            changes: dict[str, Any] = {"metadata": metadata}
            if tags != list(keeper["keywords"] or []):
                changes.update(keywords=tags, morphemes=content_morphemes(keeper["content"]))
            await entries_repo.update_entry(conn, keeper["id"], changes)
            gone.extend(r["id"] for r in absorbed)
            merged += 1
            removed += len(absorbed)
        if gone:
            await entries_repo.delete_entries(conn, ctx.principal.writes, namespace["id"], gone)
        if gone or merged:
            await ns_repo.touch(conn, [namespace["id"]])
    await invalidate_recall_cache(res, ctx.principal)
    unchanged = len(rows) - len(stale) - removed - merged
    return {"mergedCount": merged, "removedCount": removed, "unchangedCount": unchanged, "prunedCount": len(stale)}


# -- LLM consolidation ----------------------------------------------------------------------


def cosine_clusters(rows: list[Any]) -> list[list[Any]]:
    """Greedy, newest first: an entry joins the first cluster whose newest entry is within
    LLM_CLUSTER_COSINE of it (entries without an embedding stay alone)."""
    clusters: list[tuple[np.ndarray | None, list[Any]]] = []
    for row in rows:
        vector = np.asarray(row["embedding"].to_numpy() if hasattr(row["embedding"], "to_numpy") else row["embedding"]) \
            if row["embedding"] is not None else None
        if vector is not None:
            vector = vector / (np.linalg.norm(vector) or 1.0)
            for head, members in clusters:
                if head is not None and float(head @ vector) >= LLM_CLUSTER_COSINE:
                    members.append(row)
                    break
            else:
                clusters.append((vector, [row]))
        else:
            clusters.append((None, [row]))
    return [members for _, members in clusters]


async def run_llm_consolidation(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Every namespace of the caller's but agent-experience banks: clusters of similar auto
    entries rewritten by the LLM into one canonical auto entry (the members' tags and
    metadata kept), the members removed. A cluster the LLM did not answer stays as it was."""
    principal = ctx.principal
    try:
        llm = _router()
    except MemoryApiError:
        async with res.pool.acquire() as conn:
            await status_repo.record_attempt(conn, principal.key_id, ran=False, error=ROUTER_DOWN)
        raise
    budget = llm.budget()
    report = {"namespacesScanned": 0, "namespacesSkipped": 0, "clustersFound": 0, "clustersConsolidated": 0,
              "clustersFailed": 0, "entriesRemoved": 0, "entriesCreated": 0}
    async with res.pool.acquire() as conn:
        namespaces = await ns_repo.list_namespaces(conn, principal.writes)
    for namespace in namespaces:
        if banks.consolidation_protected(namespace["name"], namespace["description"]):
            report["namespacesSkipped"] += 1
            continue
        report["namespacesScanned"] += 1
        async with res.pool.acquire() as conn:
            rows = await entries_repo.newest_auto(conn, principal.writes, namespace["id"], banks.CONSOLIDATE_WINDOW,
                                                  with_embedding=True)
        for cluster in (c for c in cosine_clusters(rows) if len(c) > 1):
            report["clustersFound"] += 1
            prompt = "\n".join(f"- {r['content']}" for r in cluster)
            answer = await _complete(llm, CONSOLIDATE_SYSTEM, prompt, budget)
            if not answer or banks.byte_length(answer) > banks.CONTENT_MAX_BYTES:
                report["clustersFailed"] += 1
                continue
            await _replace_cluster(res, principal, namespace, cluster, answer.strip())
            report["clustersConsolidated"] += 1
            report["entriesRemoved"] += len(cluster)
            report["entriesCreated"] += 1
    error = f"{report['clustersFailed']} cluster(s) not rewritten: the LLM did not answer" if report["clustersFailed"] else None
    async with res.pool.acquire() as conn:
        await status_repo.record_attempt(conn, principal.key_id, ran=True, error=error)
    return {**report, "llmCalls": budget.used, "llmFailed": budget.failed}


async def _replace_cluster(res: WriteResources, principal: Principal, namespace: Any, cluster: list[Any], content: str) -> None:
    fields = screened(res, {"content": content})
    tags = list(dict.fromkeys(t for r in cluster for t in (r["keywords"] or [])))[: banks.TAGS_MAX]
    metadata: dict[str, Any] = {}
    for r in reversed(cluster):
        metadata.update(entries_repo.metadata_of(r["metadata"]))
    fragment = new_entry(principal, namespace, fields["content"], "auto", tags)
    await res.embed_fragments([fragment])
    jobs = res.job_buffer()
    async with res.pool.acquire() as conn, conn.transaction():
        await entries_repo.delete_entries(conn, principal.writes, namespace["id"], [r["id"] for r in cluster])
        await entries_repo.insert_entries(conn, [fragment], [namespace["id"]], [metadata or None], [None])
        await ns_repo.touch(conn, [namespace["id"]])
        await jobs.record(conn, LINK_TASK, fragment_ids=[fragment.id])
    await after_commit(res, jobs)
    await invalidate_recall_cache(res, principal)


async def consolidation_status(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """No model needed: whether the pass can run, how often it is due, and what happened last."""
    interval = res.settings.memory_consolidation_interval
    async with res.pool.acquire() as conn:
        row = await status_repo.status(conn, ctx.principal.key_id)
    last_run = row["last_run_at"] if row else None
    body: dict[str, Any] = {
        "enabled": load_llm().configured,
        "intervalHours": interval.total_seconds() / 3600,
        "due": last_run is None or datetime.now(UTC) - last_run >= interval,
        "lastRunAt": banks.iso(last_run),
    }
    if row is not None and row["last_attempt_at"] is not None:
        body["lastAttemptAt"] = banks.iso(row["last_attempt_at"])
    if row is not None and row["last_error"]:
        body["lastError"] = row["last_error"]
    return body


# -- extraction ---------------------------------------------------------------------------


def _check_messages(args: dict[str, Any]) -> list[dict[str, str]]:
    messages = args.get("messages") or []
    if not 1 <= len(messages) <= banks.EXTRACT_MESSAGES_MAX:
        raise MemoryApiError(400, f"messages must hold 1 to {banks.EXTRACT_MESSAGES_MAX} messages")
    for message in messages:
        if banks.byte_length(message["content"]) > banks.EXTRACT_MESSAGE_MAX_BYTES:
            raise MemoryApiError(400, f"a message's content must be at most {banks.EXTRACT_MESSAGE_MAX_BYTES} bytes")
    return list(messages)


async def _extract_target(conn: asyncpg.Connection, principal: Principal, config: dict[str, Any]) -> Any:
    if config.get("namespaceId"):
        namespace = await ns_repo.get_namespace(conn, principal.writes, namespace_uuid(config["namespaceId"]))
        if namespace is None:
            raise not_found("namespace")
        return namespace
    namespace = await ns_repo.find_by_name(conn, principal.owns, EXTRACTED_NAMESPACE)
    if namespace is None:
        namespace = await ns_repo.create_namespace(conn, principal.key_id, EXTRACTED_NAMESPACE, "Facts extracted from conversations")
    return namespace


async def extract(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The transcript is checked first (400 even with no LLM), then the LLM lists facts; each
    new one becomes an auto entry, one already stored (or near it) is skipped."""
    messages = _check_messages(args)
    llm = _router()
    transcript = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    answer = await _complete(llm, EXTRACT_SYSTEM, transcript, llm.budget())
    if answer is None:
        return {"created": 0, "updated": 0, "skipped": 0, "emptyReason": {"reason": "parseRecoveryFailed"}}
    lines = [line.strip().lstrip("-*• ").strip() for line in answer.splitlines()]
    candidates = [line for line in lines if line and line.upper() != "NONE"]
    if not candidates:
        return {"created": 0, "updated": 0, "skipped": 0, "emptyReason": {"reason": "nothingWorthSaving"}}
    valid = []
    for line in candidates:
        try:
            check_entry_fields(line, None)
        except MemoryApiError:
            continue
        valid.append(screened(res, {"content": line})["content"])
    if not valid:
        return {"created": 0, "updated": 0, "skipped": 0, "emptyReason": {"reason": "validationEmpty"}}
    config = args.get("config") or {}
    async with res.pool.acquire() as conn:
        namespace = await _extract_target(conn, ctx.principal, config)
        stored = [banks.word_set(r["content"]) for r in await entries_repo.entries_of(conn, ctx.principal.writes, namespace["id"])]
    fresh: list[str] = []
    for line in valid:
        words = banks.word_set(line)
        if any(banks.jaccard(words, other) >= banks.SIMILARITY_DEFAULT for other in stored):
            continue
        stored.append(words)
        fresh.append(line)
    if not fresh:
        return {"created": 0, "updated": 0, "skipped": len(valid),
                "emptyReason": {"reason": "allDeduped", "candidateCount": len(valid)}}
    fragments = [new_entry(ctx.principal, namespace, line, "auto", []) for line in fresh]
    await res.embed_fragments(fragments)
    jobs = res.job_buffer()
    async with res.pool.acquire() as conn, conn.transaction():
        await entries_repo.insert_entries(conn, fragments, [namespace["id"]] * len(fragments), [None] * len(fragments),
                                          [None] * len(fragments))
        await ns_repo.touch(conn, [namespace["id"]])
        await jobs.record(conn, LINK_TASK, fragment_ids=[f.id for f in fragments])
    await after_commit(res, jobs)
    await invalidate_recall_cache(res, ctx.principal)
    return {"created": len(fresh), "updated": 0, "skipped": len(valid) - len(fresh)}


async def ensure_model_available(res: WriteResources, ctx: ToolContext, args: dict[str, Any]) -> str:
    """One of alreadyLoaded, loaded, disabled, modelNotFound, insufficientRam, timedOut, failed:
    Engram loads no model itself, so a configured endpoint that answers is alreadyLoaded."""
    llm = load_llm()
    if not llm.configured:
        return "disabled"
    if args.get("model") and args["model"] != llm.settings.model:
        return "modelNotFound"
    answer = await _complete(llm, "Answer OK.", "ping", LLMBudget(1))
    return "alreadyLoaded" if answer is not None else "failed"


CONSOLIDATION_OPERATIONS = {
    "memory_consolidate_namespace": consolidate_namespace,
    "memory_run_consolidation": run_llm_consolidation,
    "memory_consolidation_status": consolidation_status,
    "memory_extract": extract,
    "memory_ensure_model": ensure_model_available,
}
