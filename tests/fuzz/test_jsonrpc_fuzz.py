"""Issue 15: the seeded JSON-RPC fuzzer over /mcp (tests/fuzz/jsonrpc_fuzzer.py). A few
hundred messages from a fixed seed: 0 internal errors, 0 5xx, 0 requests left without a
reply, 0 replies past the per-request timeout."""

from __future__ import annotations

import httpx

from tests.fuzz.jsonrpc_fuzzer import JsonRpcFuzzer
from tests.gateway.conftest import Gateway
from tests.support import Stack, create_api_key

SEED = 20261201
REQUESTS = 600


async def test_jsonrpc_fuzz_over_mcp_finds_no_internal_error(stack: Stack, fuzz_gateway: Gateway) -> None:
    # A tenant of its own (read + write): what the fuzzer writes or forgets stays in it.
    raw, _ = await create_api_key(stack.database_url, permissions=["read", "write"])
    async with httpx.AsyncClient(timeout=30) as http:
        report = await JsonRpcFuzzer(http, fuzz_gateway.mcp_url, raw, SEED).run(REQUESTS)
    print(f"\njsonrpc fuzz: {report.sent} sent, outcomes {dict(sorted(report.by_outcome.items()))}")
    assert report.sent >= REQUESTS
    # the fuzzer reached the tools: some calls succeeded and some were refused as invalid
    assert report.by_outcome.get("result", 0) > 0 and report.by_outcome.get("-32602", 0) > 0
    assert not report.findings, "\n".join(str(f) for f in report.findings[:25])
