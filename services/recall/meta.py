"""_meta of recall and context: hints, the suggestion engine, server time, explanations."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
from redis.exceptions import RedisError

from shared.domain.principal import Principal
from shared.domain.server_time import server_time  # noqa: F401 (re-exported)
from shared.repositories import events as events_repo
from shared.repositories import recall_views

# suggestion no_type_filter_noisy: a key scope with more fragments than this.
NOISY_SCOPE = 100
# suggestion repeat_query: the same keywords this many times within the window.
REPEAT_COUNT = 3
REPEAT_WINDOW_S = 300
# hint stale_results: every returned fragment is older than this and none was accessed since.
STALE_DAYS = 90

EXPLAIN_DETAIL = {
    "direct_keyword_match": "L2 형태소/키워드 매치",
    "semantic_similarity": "L3 임베딩 유사도",
    "graph_neighbor_1hop": "그래프 이웃 1-hop",
    "temporal_proximity": "시간 인접성 (timeRange / ±24h)",
    "case_cohort_member": "동일 case_id 코호트",
    "recent_activity_ema": "ema_activation 상위 가점",
}


def explanations(layers: set[str], *, time_filtered: bool, case_mode: bool, has_case: bool, activation: float) -> list[dict[str, str]]:
    codes = []
    if "L2" in layers:
        codes.append("direct_keyword_match")
    if "L3" in layers or "SA" in layers:
        codes.append("semantic_similarity")
    if "L2.5" in layers:
        codes.append("graph_neighbor_1hop")
    if time_filtered:
        codes.append("temporal_proximity")
    if case_mode and has_case:
        codes.append("case_cohort_member")
    if activation >= 0.5:
        codes.append("recent_activity_ema")
    return [{"code": c, "detail": EXPLAIN_DETAIL[c], "ruleVersion": "v1"} for c in codes[:3]]


async def hints(
    conn: asyncpg.Connection, principal: Principal, *, topic: str | None, fragments: list[dict[str, Any]],
    facts: dict[str, dict[str, Any]], contradictions: list[tuple[str, str]], errors: list[str],
) -> list[dict[str, Any]]:
    """facts: id -> created_at / last_accessed_at (ISO) of the returned fragments."""
    out: list[dict[str, Any]] = []
    if not fragments:
        out.append({
            "signal": "no_results",
            "suggestion": "이 주제에 대한 기억이 없습니다. 중요한 내용이라면 remember로 저장하세요.",
            "trigger": "remember",
        })
        if topic:
            similar = await recall_views.similar_topics(conn, principal, topic)
            if similar:
                out.append({
                    "signal": "topic_mismatch",
                    "suggestion": f"topic '{topic}'에는 기억이 없습니다. 유사한 topic '{similar[0]}'(으)로 다시 검색해 보세요.",
                    "trigger": "recall",
                    "args": {"topic": similar[0]},
                    "candidates": similar,
                })
        return out
    if contradictions:
        out.append({
            "signal": "contradiction_pending",
            "suggestion": "반환된 파편 중 해결되지 않은 모순(contradicts) 링크가 있습니다. amend로 정리하세요.",
            "trigger": "amend",
            "pairs": [list(p) for p in contradictions[:5]],
        })
    now = datetime.now(UTC)

    def age(value: str | None) -> float:
        return (now - datetime.fromisoformat(value)).days if value else float("inf")

    if facts and all(age(f["created_at"]) > STALE_DAYS and age(f["last_accessed_at"]) > STALE_DAYS for f in facts.values()):
        out.append({
            "signal": "stale_results",
            "suggestion": f"반환된 파편이 모두 {STALE_DAYS}일 넘게 갱신·조회되지 않았습니다. 최신 정보인지 확인하고 필요하면 amend하세요.",
            "trigger": "amend",
        })
    if errors:
        out.append({
            "signal": "active_errors",
            "suggestion": "해결되지 않은 error 파편이 있습니다. 원인·해결 경로는 graph_explore로 추적하세요.",
            "trigger": "graph_explore",
            "fragmentIds": errors[:5],
        })
    return out


async def suggestion(
    conn: asyncpg.Connection, redis: Any | None, principal: Principal, *, keywords: list[str] | None, query_type: str,
    result_count: int, context_text: str | None, type_filtered: bool, scope_total: int, top_case: str | None,
) -> dict[str, Any] | None:
    """RecallSuggestionEngine: the first rule that holds, in the documented order."""
    if keywords and query_type in ("keywords", "mixed") and await _repeats(conn, redis, principal, keywords) >= REPEAT_COUNT:
        if top_case:
            return {"code": "repeat_query", "message": "같은 키워드 검색이 5분 내 반복되었습니다. 케이스 타임라인을 재구성해 보세요.",
                    "recommendedTool": "reconstruct_history", "recommendedArgs": {"caseId": top_case}}
        return {"code": "repeat_query", "message": "같은 키워드 검색이 5분 내 반복되었습니다. 그래프 탐색으로 연관 파편을 따라가 보세요.",
                "recommendedTool": "graph_explore"}
    if result_count == 0 and not context_text:
        return {"code": "empty_result_no_context",
                "message": "결과가 없습니다. contextText 파라미터로 현재 맥락을 전달하면 "
                           "SpreadingActivation이 관련 파편을 선제 활성화합니다.",
                "recommendedTool": "recall", "recommendedArgs": {"contextText": "현재 작업 맥락 요약"}}
    # large_limit_no_budget: recall's page-size parameter is pageSize, not limit (seed: "현재 이
    # 규칙은 발화하지 않는다"), so the rule is evaluated and never holds.
    if not type_filtered and scope_total > NOISY_SCOPE:
        return {"code": "no_type_filter_noisy",
                "message": f"키 스코프에 파편이 {scope_total}건 있습니다. type 필터를 지정하면 결과가 정밀해집니다.",
                "recommendedTool": "recall", "recommendedArgs": {"type": "fact"}}
    return None


async def _repeats(conn: asyncpg.Connection, redis: Any | None, principal: Principal, keywords: list[str]) -> int:
    """This call plus the same keyword searches of the last five minutes. Redis keeps a
    sliding window (search events are written after the response); without it the events."""
    normalised = sorted({k.lower() for k in keywords})
    if redis is not None:
        joined = "\x1f".join(normalised)
        key = f"engram:recall:repeat:{principal.key_id or 'master'}:{joined}"
        now = time.time()
        try:
            pipe = redis.pipeline(transaction=False)
            pipe.zremrangebyscore(key, 0, now - REPEAT_WINDOW_S)
            pipe.zadd(key, {f"{now:.6f}": now})
            pipe.zcard(key)
            pipe.expire(key, REPEAT_WINDOW_S)
            return int((await pipe.execute())[2])
        except RedisError:
            pass
    return 1 + await events_repo.recent_keyword_searches(conn, principal.key_id, normalised, REPEAT_WINDOW_S)
