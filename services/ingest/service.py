"""The write path: remember, batch_remember, forget."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
import numpy as np

from services.common.internal import ToolContext
from shared.contract.write import RememberArgs
from shared.domain import fragment as frag
from shared.domain.errors import InvalidParams
from shared.domain.keywords import merge_keywords
from shared.domain.principal import Principal
from shared.embeddings import Embedder
from shared.jobs import JobBuffer
from shared.repositories import fragments as fragments_repo
from shared.repositories import links as links_repo

logger = logging.getLogger(__name__)

# Near-duplicates reported as `conflicts` on remember (cosine similarity).
CONFLICT_SIMILARITY = 0.92
TOO_SHORT = "Content too short: length < 10 and word count < 3"


@dataclass
class WriteResources:
    pool: asyncpg.Pool
    embedder: Embedder

    async def embed(self, texts: list[str]) -> np.ndarray:
        # The model holds the GIL only partly; a worker thread keeps the event loop free.
        return await anyio.to_thread.run_sync(self.embedder.embed, texts)


def resolve_workspace(principal: Principal, explicit: str | None, batch_default: str | None = None) -> tuple[str | None, str]:
    if explicit:
        return explicit, "explicit"
    if batch_default:
        return batch_default, "explicit"
    if principal.default_workspace:
        return principal.default_workspace, "key_default"
    return None, "unscoped"


def build_fragment(args: RememberArgs, ctx: ToolContext, batch_workspace: str | None = None) -> frag.NewFragment:
    if frag.content_too_short(args.content):
        raise InvalidParams(TOO_SHORT)
    workspace, workspace_source = resolve_workspace(ctx.principal, args.workspace, batch_workspace)
    content = frag.stored_content(args.content, args.type)
    session_id = args.sessionId or ctx.session_id
    return frag.NewFragment(
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


def embedding_text(f: frag.NewFragment) -> str:
    return f"{f.topic}: {f.content}" if f.topic else f.content


async def after_commit(res: WriteResources, jobs: JobBuffer, celery: Any) -> None:
    """Send buffered jobs; whatever could not be queued runs here so nothing is dropped."""
    # Sending talks to Redis synchronously (kombu); keep it off the event loop.
    unsent = await anyio.to_thread.run_sync(jobs.send, celery)
    for job in unsent:
        if job.task == "maintenance.link_new_fragments":
            async with res.pool.acquire() as conn, conn.transaction():
                await links_repo.auto_link(conn, job.kwargs["fragment_ids"])
        else:
            logger.error("job %s could not be queued and has no inline path", job.task)


async def check_quota(conn: asyncpg.Connection, principal: Principal, adding: int) -> dict[str, int] | None:
    if principal.key_id is None or principal.fragment_limit is None:
        return None
    used = await fragments_repo.count_owned(conn, principal.key_id)
    return {"used": used, "limit": principal.fragment_limit, "remaining": max(principal.fragment_limit - used - adding, -1)}
