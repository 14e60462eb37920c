"""A second stack on the same database and Redis with two recall replicas behind its gateway,
MEMENTO_SYMBOLIC_EXPLAIN=true and ENABLE_SPREADING_ACTIVATION=true."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from services.stack.supervisor import free_port
from tests.support import Stack, call, create_api_key, mcp_session, new_stack_config, running, unique

REASON_CODES = {"direct_keyword_match", "semantic_similarity", "graph_neighbor_1hop", "temporal_proximity",
                "case_cohort_member", "recent_activity_ema"}


@pytest.fixture(scope="module")
async def flagged(stack: Stack, stack_dir: Path) -> AsyncIterator[Stack]:
    config = new_stack_config(
        stack_dir / "recall-flags", database_url=stack.database_url, redis_url=stack.redis_url,
        recall_ports=[free_port(), free_port()], worker=False, beat=False, master_key=stack.master_key,
    )
    config.extra_env.update({"MEMENTO_SYMBOLIC_EXPLAIN": "true", "ENABLE_SPREADING_ACTIVATION": "true"})
    async with running(config) as own:
        yield own


async def _recall_requests(url: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("engram_tool_calls_total{") and 'tool="recall"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_explanations_with_reason_codes(flagged: Stack) -> None:
    ws = unique()
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        await call(s, "remember", {"content": "Terraform state lives in the S3 bucket infra-state.", "topic": "terraform", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"text": "where is the terraform state", "workspace": ws, "timeRange": {"from": "today"}})
        codes = found["fragments"][0]["explanations"]
        assert 1 <= len(codes) <= 3
        assert {c["code"] for c in codes} <= REASON_CODES and {"direct_keyword_match", "semantic_similarity"} <= {c["code"] for c in codes}
        assert all(c["ruleVersion"] == "v1" and c["detail"] for c in codes)
        sparse = await call(s, "recall", {"text": "where is the terraform state", "workspace": ws, "fields": ["id", "explanations"]})
        assert set(sparse["fragments"][0]) == {"id", "explanations"}


async def test_main_stack_has_no_explanations(mcp_url: str, master_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, master_key) as s:
        await call(s, "remember", {"content": "Terraform modules are pinned by git tag.", "topic": "terraform", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"text": "terraform modules pinned", "workspace": ws})
        assert "explanations" not in found["fragments"][0]


async def test_spreading_activation_from_context_text(flagged: Stack) -> None:
    ws = unique()
    # A key of its own: the master key would also see every other test's global fragments in this
    # shared database, and spreading activation may rightly prefer one of those.
    key, _ = await create_api_key(flagged.database_url)
    async with mcp_session(flagged.mcp_url, key) as s:
        near = await call(s, "remember", {"content": "The mobile app release is blocked on App Store review.", "topic": "mobile", "type": "fact", "workspace": ws})
        await call(s, "remember", {"content": "Lunch on Fridays is pizza.", "topic": "office", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"keywords": ["zzz-no-such-keyword"], "workspace": ws, "threshold": 0.99,
                                         "contextText": "we are waiting for Apple to approve the iOS app release"})
        assert "SA:" in found["searchPath"]
        assert near["id"] in [f["id"] for f in found["fragments"]]


async def test_two_replicas_both_serve_the_same_results(flagged: Stack) -> None:
    ws = unique()
    before = [await _recall_requests(url) for url in flagged.recall_urls]
    async with mcp_session(flagged.mcp_url, flagged.master_key) as s:
        await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"Replica check fragment {i} about queue depth alarms.", "topic": "replicas", "type": "fact"} for i in range(5)
        ]})
        answers = [await call(s, "recall", {"text": "queue depth alarms", "workspace": ws, "excludeSeen": False, "fields": ["id"]}) for _ in range(6)]
    after = [await _recall_requests(url) for url in flagged.recall_urls]
    assert all(b > a for a, b in zip(before, after)), (before, after)
    assert len({tuple(f["id"] for f in r["fragments"]) for r in answers}) == 1
