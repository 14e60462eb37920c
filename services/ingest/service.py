"""What every write tool shares: resources, building a fragment from arguments (workspace
resolution, secret screening, truncation, keywords), quota, and post-commit jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import asyncpg
import numpy as np
import tenacity
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisError

from services.common.internal import ToolContext
from shared.contract.write import RememberArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams
from shared.domain.keywords import merge_keywords
from shared.domain.passages import embedding_inputs, pooled_inputs, split_vectors
from shared.domain.principal import Principal
from shared.domain.secrets import screen_args
from shared.embeddings import Embedder
from shared.embeddings.model import pooled
from shared.job_relay import Inline, OutboxRelay
from shared.jobs import LINK_TASK, JobBuffer
from shared.metrics import EMBED_BATCH, EMBED_SECONDS
from shared.recall_cache import bump_recall_generation
from shared.repositories import fragments as fragments_repo
from shared.repositories import keys as keys_repo
from shared.repositories import links as links_repo
from shared.repositories.batch_jobs import BatchQueue
from shared.settings import IngestSettings

logger = logging.getLogger(__name__)

ArgsT = TypeVar("ArgsT", bound=BaseModel)

# Near-duplicates reported as `conflicts` on remember (cosine similarity).
CONFLICT_SIMILARITY = 0.92
TOO_SHORT = "Content too short: length < 10 and word count < 3"
QUOTA_EXCEEDED = "fragment_limit_exceeded"


# A write that deletes or re-homes fragments can deadlock with the worker's link job, which
# locks the same fragments' rows in its own order (seen: consolidating 500 entries right after
# importing them; forget by topic beside the link job of the fragments it deletes). Postgres
# aborts one side and its transaction rolls back whole, so the transaction is run again, a few
# times, after a short random pause. Use a copy per call: a Retrying object keeps its call's state.
RETRY_CONFLICTS = tenacity.AsyncRetrying(
    retry=tenacity.retry_if_exception_type((asyncpg.DeadlockDetectedError, asyncpg.SerializationError)),
    stop=tenacity.stop_after_attempt(4), wait=tenacity.wait_random(0.05, 0.5), reraise=True,
)


# Texts per model call at most. Each call runs on one thread and up to
# embedder.parallel_calls (the cores) run at once, so a batch is cut into that many slices
# or a multiple (200 texts on 2 cores: 4 slices of 50), the slices of concurrent requests
# share the same slots, and a remember waits at most one slice behind a 200-item batch.
EMBED_SLICE = 64


@dataclass
class WriteResources:
    pool: asyncpg.Pool
    embedder: Embedder
    settings: IngestSettings = field(default_factory=IngestSettings)
    redis: Redis | None = None
    # With Redis: jobs go to the outbox and this relays them; without, they run inline.
    relay: OutboxRelay | None = None
    _embed_turn: anyio.CapacityLimiter | None = None

    def job_buffer(self) -> JobBuffer:
        return JobBuffer(outbox=self.relay.broker if self.relay is not None else None)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, one row per text."""
        return await self._sliced(texts, self.embedder.embed, self.embedder.dimensions)

    async def _sliced(self, texts: list[str], run: Callable[[list[str]], np.ndarray], width: int) -> np.ndarray:
        # Model calls run in worker threads (onnxruntime releases the GIL), keeping the
        # event loop free; texts are sorted by length first so each slice pads little.
        if not texts:
            return np.zeros((0, width), dtype=np.float32)
        lanes = max(1, getattr(self.embedder, "parallel_calls", 1))
        if self._embed_turn is None:
            self._embed_turn = anyio.CapacityLimiter(lanes)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        slices = lanes * -(-len(texts) // (lanes * EMBED_SLICE))
        size = -(-len(texts) // slices)
        parts: list[np.ndarray | None] = [None] * -(-len(texts) // size)

        async def one(n: int) -> None:
            chunk = [texts[i] for i in order[n * size:(n + 1) * size]]
            parts[n] = await anyio.to_thread.run_sync(run, chunk, limiter=self._embed_turn)

        async with anyio.create_task_group() as tg:
            for n in range(len(parts)):
                tg.start_soon(one, n)
        out = np.empty((len(texts), width), dtype=np.float32)
        out[order] = np.concatenate(parts)  # type: ignore[arg-type]
        return out

    async def embed_content(self, items: list[tuple[str | None, str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each (topic, content): its embedding and its passages' (shared.domain.passages),
        all in one embed call. Content with passages is embedded once, as its passages: its
        own embedding is pooled from their runs (pooled_inputs) instead of a run of its own.
        A backend without token sums (torch) embeds its text and its passages apart."""
        embed_sums = getattr(self.embedder, "embed_sums", None)
        if embed_sums is None:
            texts, spans = embedding_inputs(items)
            return split_vectors(await self.embed(texts), spans)
        texts, spans = pooled_inputs(items)

        def timed(chunk: list[str]) -> np.ndarray:  # as the embedder's own wrapper times embed()
            started = time.perf_counter()
            try:
                return embed_sums(chunk)
            finally:
                EMBED_SECONDS.observe(time.perf_counter() - started)
                EMBED_BATCH.observe(len(chunk))

        sums = await self._sliced(texts, timed, self.embedder.dimensions + 1)
        # Each fragment's texts are consecutive rows: its passages, or its own text alone.
        vectors, fragment_vectors = pooled(sums, [start for start, _ in spans])
        return [(fragment_vectors[k], vectors[start:start + n]) for k, (start, n) in enumerate(spans)]

    async def embed_fragments(self, fragments: list[frag.NewFragment]) -> None:
        """Sets each fragment's embedding and passage embeddings."""
        for f, (vector, passage_vectors) in zip(
            fragments, await self.embed_content([(f.topic, f.content) for f in fragments]), strict=True
        ):
            f.embedding, f.passage_embeddings = vector, passage_vectors

    def batch_queue(self) -> BatchQueue | None:
        return BatchQueue(self.redis) if self.redis is not None else None


def resolve_workspace(principal: Principal, explicit: str | None, batch_default: str | None = None) -> tuple[str | None, str]:
    """seed workspace_source: explicit (the request, or the batch default) / key_default / unscoped."""
    if explicit:
        return explicit, "explicit"
    if batch_default:
        return batch_default, "explicit"
    if principal.default_workspace:
        return principal.default_workspace, "key_default"
    return None, "unscoped"


def workspace_not_allowed(principal: Principal, workspace: str | None) -> bool:
    return principal.allowed_workspaces is not None and workspace not in principal.allowed_workspaces


class Screening:
    """Secret screening of one write: every text its arguments carry, refused (SecretFound:
    -32602 naming the field and the kinds) or redacted, per ENGRAM_SECRET_POLICY. Kinds
    redacted gather in `redacted` for the reply's secrets_redacted."""

    def __init__(self, settings: IngestSettings, clean: set[tuple[str, str]] | None = None) -> None:
        self.policy = settings.secret_policy
        self.redacted: list[str] = []
        # (field, text) pairs already screened clean under this policy, shared by the items
        # of one batch: a batch's items repeat their topic, type, workspace and agentId, and
        # each screen of a short text is ~30-50 us of regexes (a LoCoMo turn's content ~250);
        # plan_items went 0.34 -> 0.22 ms a LoCoMo turn.
        self.clean = clean

    def args(self, args: ArgsT, skip: frozenset[str] = frozenset()) -> ArgsT:
        if self.clean is None:
            return screen_args(args, self.policy, self.redacted, skip)
        texts = {name: value for name in type(args).model_fields if isinstance(value := getattr(args, name), str)}
        known = frozenset(name for name, value in texts.items() if (name, value) in self.clean)
        screened = screen_args(args, self.policy, self.redacted, skip | known)
        # The field's text came back as given (not redacted, not refused): clean. Screening
        # depends on the field's name (identifiers are refused, never redacted) and its text.
        self.clean.update((name, value) for name, value in texts.items()
                          if name not in skip and getattr(screened, name) is value)
        return screened


def build_fragment(
    args: RememberArgs, ctx: ToolContext, settings: IngestSettings, batch_workspace: str | None = None,
    screened_clean: set[tuple[str, str]] | None = None,
) -> frag.NewFragment:
    # Screen the full input before truncation: a secret across the 300-char cut is still one.
    screening = Screening(settings, screened_clean)
    args = screening.args(args)
    raw_content = args.content
    if frag.content_too_short(raw_content):
        raise InvalidParams(TOO_SHORT)
    workspace, workspace_source = resolve_workspace(ctx.principal, args.workspace, batch_workspace)
    content = frag.stored_content(raw_content, args.type)
    session_id = args.sessionId or ctx.session_id
    f = frag.NewFragment(
        id=frag.new_fragment_id(),
        content=content,
        topic=args.topic.strip(),
        type=args.type,
        keywords=merge_keywords(args.keywords, content, frag.MAX_KEYWORDS),
        importance=args.importance if args.importance is not None else frag.DEFAULT_IMPORTANCE[args.type],
        content_hash=frag.content_hash(content),
        source=args.source,
        scope=args.scope,
        is_anchor=args.isAnchor,
        ttl_tier=frag.initial_ttl_tier(is_anchor=args.isAnchor, scope=args.scope),
        key_id=ctx.principal.key_id,
        workspace=workspace,
        workspace_source=workspace_source,
        agent_id=args.agentId or "default",
        session_id=session_id,
        # seed: caseId defaults to the current session.
        case_id=args.caseId or session_id,
        goal=args.goal,
        outcome=args.outcome,
        phase=args.phase,
        resolution_status=args.resolutionStatus,
        assertion_status=args.assertionStatus,
        affect=args.affect,
        context_summary=args.contextSummary,
    )
    if screening.redacted:
        f.extra["secrets_redacted"] = screening.redacted
    return f


async def _link_new_fragments(conn: asyncpg.Connection, kwargs: dict[str, Any]) -> None:
    await links_repo.auto_link(conn, kwargs["fragment_ids"])


# Jobs ingest can run itself: without Redis, and in the relay while the broker is down.
INLINE_JOBS: Inline = {LINK_TASK: _link_new_fragments}


async def after_commit(res: WriteResources, jobs: JobBuffer) -> None:
    """The write has committed and is reported as stored whatever happens here: recorded jobs
    are the relay's (woken now); without Redis the buffered jobs run inline, best effort."""
    if jobs.recorded and res.relay is not None:
        res.relay.wake()
    for job in jobs.jobs:
        run = INLINE_JOBS.get(job.task)
        if run is None:
            logger.error("job %s has no inline path without Redis", job.task)
            continue
        try:
            async with res.pool.acquire() as conn, conn.transaction():
                await run(conn, job.kwargs)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            # The fragments stay in fragment_link_pending; the link sweep makes their links.
            logger.warning("job %s %s deferred to the periodic sweep", job.task, job.kwargs, exc_info=True)
    jobs.jobs.clear()


async def invalidate_recall_cache(res: WriteResources, principal: Principal) -> None:
    """After a write committed: cached recalls that could show the caller's fragments are
    stale. The master key may have changed any tenant's rows, so it invalidates them all."""
    if res.redis is None:
        return
    try:
        if principal.is_master:
            await bump_recall_generation(res.redis, all_tenants=True)
        else:
            await bump_recall_generation(res.redis, [principal.key_id])
    except RedisError:
        # The cache re-checks updated_at on every hit, so a missed bump is not a stale read.
        logger.warning("could not invalidate the recall cache", exc_info=True)


async def check_quota(conn: asyncpg.Connection, principal: Principal, adding: int) -> dict[str, int] | None:
    if principal.key_id is None or principal.fragment_limit is None:
        return None
    used = await fragments_repo.count_owned(conn, principal.key_id)
    return {"used": used, "limit": principal.fragment_limit, "remaining": max(principal.fragment_limit - used - adding, -1)}


async def lock_quota(conn: asyncpg.Connection, principal: Principal, adding: int) -> dict[str, int] | None:
    """Quota check under a row lock on the key, so concurrent writers cannot overshoot.

    remember takes it only under MEMENTO_REMEMBER_ATOMIC=true (seed); batch_remember always
    does: a batch is one transaction already, and the lock is one indexed row."""
    if principal.key_id is None or principal.fragment_limit is None:
        return None
    await keys_repo.lock_key(conn, principal.key_id)
    return await check_quota(conn, principal, adding)
