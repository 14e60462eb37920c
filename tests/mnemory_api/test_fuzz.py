"""schemathesis over /api/openapi.json (the mnemory REST surface, reference 004) with an API key:
cases that fit the schema and cases that do not, a fixed number of derandomized examples per
operation; no answer may be a 5xx. On a gateway of its own with limits no run reaches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from services.stack.supervisor import Stack
from tests.gateway.conftest import Gateway, start_gateway
from tests.support import create_api_key

EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 10}
REQUEST_TIMEOUT_S = 60.0
FUZZ_REDIS_DB = 12


@pytest.fixture(scope="module")
def fuzz_gateway(stack: Stack) -> Iterator[Gateway]:
    proc, gateway = start_gateway(stack, "gateway-mnemory-fuzz", FUZZ_REDIS_DB, {
        "RATE_LIMIT_PER_IP_PER_MIN": "1000000", "RATE_LIMIT_PER_KEY_PER_MIN": "1000000", "REMEMBER_RATE_LIMIT": "0"})
    yield gateway
    proc.stop()


async def test_api_fuzz_finds_no_server_error(stack: Stack, fuzz_gateway: Gateway) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(timeout=30) as client:
        document: dict[str, Any] = (await client.get(f"{fuzz_gateway.url}/api/openapi.json")).json()
    operations = [result.ok() for result in schemathesis.openapi.from_dict(document).get_all_operations()]
    assert any(op.path == "/api/memories/search" for op in operations)
    problems: list[str] = []
    with requests.Session() as session:
        for operation in operations:
            for mode, count in EXAMPLES.items():

                @settings(max_examples=count, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
                @given(operation.as_strategy(generation_mode=mode))
                def run(case: Any) -> None:
                    try:
                        response = case.call(base_url=fuzz_gateway.url, session=session, headers={"X-API-Key": key},
                                             timeout=REQUEST_TIMEOUT_S)
                    except requests.Timeout:
                        problems.append(f"{case.method} {case.formatted_path}: no answer within {REQUEST_TIMEOUT_S} s")
                        return
                    if response.status_code >= 500:
                        problems.append(f"{case.method} {case.formatted_path} -> {response.status_code} {response.text[:200]!r}"
                                        f" (query {case.query!r}, body {str(case.body)[:300]!r})")

                run()
    assert not problems, "\n".join(problems[:25])
