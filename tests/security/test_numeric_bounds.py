"""Numbers a client may send past what Postgres or date arithmetic holds: a paging offset past
bigint, an age in days past any date. Each is a client error with the surface's own code, never
a 500 (the fuzzer once found GET /api/sessions?offset=<huge> answered 503 from recall's 500)."""

from __future__ import annotations

import httpx

from tests.support import Stack, create_api_key

HUGE = 2**70


async def test_huge_offsets_and_ages_are_client_errors(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers={"X-API-Key": key}, timeout=60) as http:
        sessions = await http.get("/api/sessions", params={"offset": HUGE})
        assert sessions.status_code == 422, sessions.text
        assert (await http.get("/api/sessions", params={"offset": 2**31 - 1})).status_code == 200
        namespace = await http.post("/api/v1/memory/namespaces", json={"name": "bounds", "description": "numeric bounds"})
        assert namespace.status_code == 201, namespace.text
        ns = namespace.json()["id"]
        entries = await http.get(f"/api/v1/memory/namespaces/{ns}/entries", params={"offset": HUGE})
        assert 400 <= entries.status_code < 500, entries.text
        aged = await http.post(f"/api/v1/memory/namespaces/{ns}/consolidate", json={"config": {"maxEntryAgeDays": HUGE}})
        assert 400 <= aged.status_code < 500, aged.text
