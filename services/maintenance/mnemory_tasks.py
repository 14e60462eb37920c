"""/api/remember's work (reference 004), on the worker: the facts of one conversation exchange
extracted and stored through ingest (raw layer, linked to the session's summary), then the
stored ids added to the client's memory session so the next /api/recall does not echo them.

The job comes from the job outbox (services/ingest/mnemory_api.remember_accept), so it exists
once the client heard {"accepted": true}; a worker killed mid-job gets it again (acks_late).
Each fact carries an idempotency key (request id + its index) and a finished request is
recorded, so a redelivery stores nothing twice."""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.common.rpc import InternalClient
from services.maintenance.celery_app import app
from services.maintenance.runtime import WorkerRuntime, runtime
from services.maintenance.tasks import RETRY, RETRYABLE
from shared.domain.errors import Unavailable
from shared.domain.mnemory import extract_facts, llm_facts, transcript
from shared.memory_sessions import RedisMemorySessions, owner_of
from shared.repositories import mnemory_sessions as sessions_repo

logger = logging.getLogger(__name__)

INGEST_TIMEOUT = 60.0
async def remember_exchange(rt: WorkerRuntime, request_id: str, principal: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    async with rt.pool.acquire() as conn:
        done = await sessions_repo.request_done(conn, request_id)
    if done is not None:
        return {"requestId": request_id, "skipped": "already stored", "memoryIds": done}
    facts = llm_facts(rt.llm, request)
    if facts is None:
        facts = extract_facts(request)
    session_id = request.get("session_id")
    stored: list[str] = []
    replicas = {"ingest": InternalClient.replicas(rt.settings.ingest_url)}
    async with InternalClient(replicas, rt.settings.service_token, INGEST_TIMEOUT) as ingest:
        for n, fact in enumerate(facts):
            arguments = {
                "content": fact.content, "memory_type": fact.memory_type, "role": fact.role, "labels": request.get("labels"),
                "caller_agent_id": request.get("caller_agent_id"), "memory_layer": "raw", "session_id": session_id,
                "idempotency_key": f"{request_id}:{n}",
            }
            result, is_error = await ingest.call("ingest", "mnemory_add_internal", arguments, principal, None)
            if is_error:  # a refused fact (a secret under ENGRAM_SECRET_POLICY=reject, quota): the others still count
                logger.info("remember %s: fact %d not stored: %s", request_id, n, result.get("message"))
                continue
            stored.extend(r["id"] for r in result["results"])
    key_id = principal.get("key_id")
    async with rt.pool.acquire() as conn, conn.transaction():
        if not await sessions_repo.finish_request(conn, request_id, key_id, stored):
            return {"requestId": request_id, "skipped": "finished by another delivery"}
        if session_id:
            await sessions_repo.record_exchange(conn, key_id, session_id, request.get("caller_agent_id"), transcript(request), stored)
    if session_id and rt.settings.redis_active:
        await _add_known(rt, owner_of(key_id), session_id, stored)
    return {"requestId": request_id, "facts": len(facts), "memoryIds": stored}


async def _add_known(rt: WorkerRuntime, owner: str, session_id: str, ids: list[str]) -> None:
    """Stored ids join the client's memory session (prolonging it), so the next recall does not
    echo them; a session that expired meanwhile is left alone (reference: losing one is harmless)."""
    client = aioredis.from_url(rt.settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        sessions = RedisMemorySessions(client)
        session = await sessions.get(session_id, owner)
        if session is not None:
            await sessions.add_known(session, ids)
    except (RedisError, OSError):
        logger.warning("memory session %s not updated after remember", session_id, exc_info=True)
    finally:
        await client.aclose()


@app.task(name="maintenance.mnemory_remember", autoretry_for=(*RETRYABLE, Unavailable), **RETRY)
def mnemory_remember(request_id: str, principal: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    rt = runtime()
    return rt.run(lambda _pool: remember_exchange(rt, request_id, principal, request))
