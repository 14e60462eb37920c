"""Feedback-sampling hints on successful writes (seed: 피드백 샘플링 힌트).

remember 0.10, amend 0.25, forget 0.25; at most 2 hints per session and 900 s between two
(both kept in Redis; without Redis neither limit applies). Off with
MEMENTO_FEEDBACK_SAMPLING=false.
"""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError

from services.ingest.service import WriteResources
from shared.domain.server_time import server_time

logger = logging.getLogger(__name__)

_KEY = "engram:feedback:{session}"


def _hint(tool: str) -> dict[str, Any]:
    return {
        "signal": "feedback_sampled",
        "suggestion": (
            f"방금 {tool} 결과가 의도한 대로 유용했는지 tool_feedback으로 평가해 주세요. "
            "relevant=false인 경우 irrelevance_reason도 함께 보내면 원인별 개선에 반영됩니다."
        ),
        "trigger": "tool_feedback",
        "args": {"tool_name": tool, "trigger_type": "sampled"},
    }


def _rate(res: WriteResources, tool: str) -> float:
    s = res.settings
    return {"remember": s.feedback_rate_remember, "amend": s.feedback_rate_amend, "forget": s.feedback_rate_forget}.get(tool, 0.0)


async def _admit(res: WriteResources, session_id: str | None) -> bool:
    """Per-session cap and cooldown in Redis; True when this hint may be sent."""
    if res.redis is None or not session_id:
        return True
    key = _KEY.format(session=session_id)
    s = res.settings
    cooldown_ms = int(s.feedback_cooldown.total_seconds() * 1000)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    try:
        count, last = await res.redis.hmget(key, "count", "last_ms")
        if count is not None and int(count) >= s.feedback_max_per_session:
            return False
        if last is not None and now_ms - int(last) < cooldown_ms:
            return False
        async with res.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "count", 1)
            pipe.hset(key, "last_ms", now_ms)
            pipe.expire(key, 24 * 3600)
            new_count, _, _ = await pipe.execute()
        return int(new_count) <= s.feedback_max_per_session
    except RedisError:
        logger.warning("feedback sampling limits unavailable (Redis); sampling without them", exc_info=True)
        return True


async def attach_hint(res: WriteResources, tool: str, session_id: str | None, result: dict[str, Any]) -> dict[str, Any]:
    """Add `_meta` with one feedback_sampled hint when this call is sampled; else unchanged."""
    if not res.settings.feedback_sampling_on:
        return result
    if random.random() >= _rate(res, tool):  # noqa: S311 - sampling, not security
        return result
    if not await _admit(res, session_id):
        return result
    return {**result, "_meta": {"hints": [_hint(tool)], "serverTime": server_time()}}
