"""Seams between the areas: what one service writes, another reads correctly."""

from __future__ import annotations

from tests.support import Stack, call, create_api_key, mcp_session, unique


# Eleven nouns before the one searched for: "서버" is not among the 10 stored keywords, so
# only the full-text vector (with its morphemes) can find it.
KOREAN = "회의에서 예산, 일정, 인력, 보안, 감사, 계약, 품질, 고객, 마케팅, 영업, 채용을 논의했고 마지막에 결제 서버가 멈췄다."


async def test_amended_korean_content_is_found_by_its_morphemes(stack: Stack) -> None:
    """amend rebuilds the full-text vector the way remember builds it (Korean morphemes too)."""
    raw, _ = await create_api_key(stack.database_url, permissions=["read", "write"])
    ws = unique()
    async with mcp_session(stack.mcp_url, raw) as s:
        stored = await call(s, "remember", {"content": "The staging deploy finished without problems today.",
                                            "topic": "deploy", "type": "fact", "workspace": ws})
        amended = await call(s, "amend", {"id": stored["id"], "content": KOREAN})
        assert amended.get("success", True) is not False
        stored_keywords = (await call(s, "recall", {"text": "회의 예산", "workspace": ws, "includeKeywords": True,
                                                    "includeLinks": False}))["fragments"][0]["keywords"]
        assert "서버" not in stored_keywords
        found = await call(s, "recall", {"keywords": ["서버"], "workspace": ws, "includeLinks": False})
    assert stored["id"] in [f["id"] for f in found["fragments"]]
    assert "L2:" in found["searchPath"] and not found["searchPath"].startswith("L2:0")


async def test_trace_and_correlation_id_ride_from_the_client_to_recall_ingest_and_worker(stack: Stack) -> None:
    import asyncio
    import uuid

    trace_id = uuid.uuid4().hex
    cid = f"cid-{uuid.uuid4().hex[:12]}"
    headers = {"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01", "x-correlation-id": cid}
    ws = unique()
    async with mcp_session(stack.mcp_url, stack.master_key, headers=headers) as s:
        await call(s, "remember", {"content": "Traced writes carry the caller's trace id to every hop.",
                                   "topic": "tracing", "type": "fact", "workspace": ws})
        await call(s, "recall", {"text": "trace id hops", "workspace": ws})

    def logged(name: str) -> bool:
        text = (stack.log_dir / name).read_text(errors="replace")
        return any(trace_id in line and cid in line for line in text.splitlines())

    assert logged("ingest.log"), "ingest did not log the caller's trace id and correlation id:\n" + "\n".join((stack.log_dir / "ingest.log").read_text(errors="replace").splitlines()[-8:])
    assert logged("recall-0.log"), "recall did not log the caller's trace id and correlation id"
    for _ in range(100):  # the post-commit job reaches the worker with the same ids
        if logged("worker.log"):
            break
        await asyncio.sleep(0.2)
    assert logged("worker.log"), "the worker's task did not carry the trace id and correlation id"
