"""The fuzz tests run against a gateway of their own: /openapi.json on, and a per-IP limit no
fuzz run reaches. On a shared gateway, the few hundred requests without a key they send
exhausted the per-IP limit that later tests of unauthenticated answers (401) rely on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.stack.supervisor import Stack
from tests.gateway.conftest import Gateway, start_gateway

# A Redis database of its own: its rate-limit counters meet no other gateway's.
FUZZ_REDIS_DB = 10


@pytest.fixture(scope="session")
def fuzz_gateway(stack: Stack) -> Iterator[Gateway]:
    proc, gateway = start_gateway(
        stack, "gateway-fuzz", FUZZ_REDIS_DB,
        {"ENABLE_OPENAPI": "true", "RATE_LIMIT_PER_IP_PER_MIN": "1000000", "RATE_LIMIT_PER_KEY_PER_MIN": "1000000"},
    )
    yield gateway
    proc.stop()
