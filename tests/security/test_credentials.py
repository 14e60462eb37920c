"""Every way in to today's HTTP surfaces (the memory REST API of reference 001 with its SSE and
WebSocket events, the mnemory REST API of reference 004, /mcp/remember-profile, the admin
routes), tried over HTTP against the real stack: no credential, unknown ones, malformed and
doubled headers, X-API-Key where only Bearer is taken, OAuth tokens on the REST surfaces, keys
set inactive or deleted, read-only keys on write routes, and allowed_workspaces."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from services.stack.supervisor import Stack
from shared.db import SEARCH_PATH
from tests.security.conftest import ADMIN, MEMORY, WAIT, deactivate, delete_key, http, oauth_token
from tests.support import call, create_api_key, mcp_session, unique

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def status(stack: Stack, method: str, path: str, headers: Any, **kwargs: Any) -> int:
    """The status a request gets; a stream (SSE) is opened and left unread."""
    async with http(stack, headers) as client, client.stream(method, path, **kwargs) as reply:
        return reply.status_code


async def ws_status(stack: Stack, headers: dict[str, str], query: str = "") -> int:
    """The WebSocket handshake's answer: 101 when it opened, else its HTTP status."""
    url = stack.gateway_url.replace("http://", "ws://") + f"{MEMORY}/ws{query}"
    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=WAIT):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


# Each surface's read, as (method, path, extra request arguments).
REST_READS = [
    ("GET", f"{MEMORY}/namespaces", {}),
    ("GET", f"{MEMORY}/events", {}),
    ("GET", "/api/memories", {}),
    ("GET", "/api/categories", {}),
]
MCP_ENDPOINTS = ["/mcp", "/mcp/remember-profile"]


async def every_surface(stack: Stack, headers: Any) -> dict[str, int]:
    """What each surface answers to one set of headers."""
    seen = {f"{m} {p}": await status(stack, m, p, headers, **kw) for m, p, kw in REST_READS}
    for path in MCP_ENDPOINTS:
        merged = [*(headers.items() if isinstance(headers, dict) else headers), *MCP_HEADERS.items()]
        seen[f"POST {path}"] = await status(stack, "POST", path, merged, json=INITIALIZE)
    seen["GET admin/keys"] = await status(stack, "GET", f"{ADMIN}/keys", headers)
    ws_headers = dict(headers) if isinstance(headers, dict) else {}
    seen["WS ws"] = await ws_status(stack, ws_headers)
    return seen


def refused_everywhere(seen: dict[str, int], code: int = 401) -> None:
    assert seen == dict.fromkeys(seen, code), seen


async def test_no_credential_and_unknown_credentials_are_401_on_every_surface(stack: Stack) -> None:
    refused_everywhere(await every_surface(stack, {}))
    for unknown in ("mmcp_" + "0" * 40, "not-a-key", "oat_unknown", "a.b.c"):
        refused_everywhere(await every_surface(stack, {"Authorization": f"Bearer {unknown}"}))
    seen = await every_surface(stack, {"X-API-Key": "mmcp_" + "1" * 40})
    refused_everywhere(seen)


async def test_malformed_authorization_headers(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    for header in ("Bearer", "Basic " + key, key, "Token " + key, "bearer\t" + key):
        refused_everywhere(await every_surface(stack, {"Authorization": header}))
    # `Bearer` with no value carries no credential: an X-API-Key beside it is the credential
    # (on /api/ paths only). Nothing is combined or guessed across the two.
    assert await status(stack, "GET", f"{MEMORY}/namespaces", {"Authorization": "Bearer", "X-API-Key": key}) == 200
    assert await status(stack, "GET", "/api/memories", {"Authorization": "Bearer", "X-API-Key": key}) == 200


async def test_bearer_wins_over_x_api_key_and_never_falls_through(stack: Stack) -> None:
    a, _ = await create_api_key(stack.database_url)
    b, _ = await create_api_key(stack.database_url)
    async with http(stack, {"X-API-Key": a}) as client:
        made = await client.post(f"{MEMORY}/namespaces", json={"name": unique("a-bank"), "description": ""})
        assert made.status_code == 201, made.text
    mine = made.json()["id"]
    # An unknown Bearer beside a valid X-API-Key: refused, not served as the X-API-Key's key.
    for method, path, kw in REST_READS:
        assert await status(stack, method, path, {"Authorization": "Bearer mmcp_" + "2" * 40, "X-API-Key": a}, **kw) == 401
    assert await ws_status(stack, {"Authorization": "Bearer mmcp_" + "2" * 40, "X-API-Key": a}) == 401
    # Two valid keys: the Bearer's tenant answers (B does not see A's bank), on every route.
    async with http(stack, {"Authorization": f"Bearer {b}", "X-API-Key": a}) as client:
        listed = await client.get(f"{MEMORY}/namespaces")
        got = await client.get(f"{MEMORY}/namespaces/{mine}")
    assert listed.status_code == 200 and mine not in {ns["id"] for ns in listed.json()}
    assert got.status_code == 404


async def test_two_authorization_headers_take_the_first_everywhere(stack: Stack) -> None:
    a, _ = await create_api_key(stack.database_url)
    unknown = "Bearer mmcp_" + "3" * 40
    # The first header is the credential on every surface, so a valid second one never rescues
    # an unknown first (and the admin routes read the same header as the front door).
    doubled = [("Authorization", unknown), ("Authorization", f"Bearer {a}")]
    for method, path, kw in REST_READS:
        assert await status(stack, method, path, doubled, **kw) == 401
    for path in MCP_ENDPOINTS:
        assert await status(stack, "POST", path, [*doubled, *MCP_HEADERS.items()], json=INITIALIZE) == 401
    master_second = [("Authorization", unknown), ("Authorization", f"Bearer {stack.master_key}")]
    assert await status(stack, "GET", f"{ADMIN}/keys", master_second) == 401
    master_first = [("Authorization", f"Bearer {stack.master_key}"), ("Authorization", unknown)]
    assert await status(stack, "GET", f"{ADMIN}/keys", master_first) == 200


async def test_x_api_key_authenticates_only_under_api(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    for path in MCP_ENDPOINTS:
        headers = [("X-API-Key", key), *MCP_HEADERS.items()]
        assert await status(stack, "POST", path, headers, json=INITIALIZE) == 401
        assert await status(stack, "POST", path, [("Authorization", f"Bearer {key}"), *MCP_HEADERS.items()],
                            json=INITIALIZE) == 200
    # The master key in X-API-Key opens no admin route, the console's login included.
    assert await status(stack, "GET", f"{ADMIN}/keys", {"X-API-Key": stack.master_key}) == 401
    assert await status(stack, "POST", f"{ADMIN}/auth", {"X-API-Key": stack.master_key}) == 401
    # Nor does a key in the query string or a cookie, on any surface (credentials are headers).
    for name in ("api_key", "apiKey", "key", "token", "accessKey"):
        assert await status(stack, "GET", f"{MEMORY}/namespaces", {}, params={name: key}) == 401
        assert await ws_status(stack, {}, f"?{name}={key}") == 401
    assert await status(stack, "GET", f"{MEMORY}/namespaces", {"Cookie": f"api_key={key}; token={key}"}) == 401
    assert await ws_status(stack, {"Cookie": f"api_key={key}; token={key}"}) == 401


async def test_oauth_tokens_are_for_mcp_only(stack: Stack) -> None:
    """Decision: an OAuth access token is issued for the MCP resource ({base}/mcp in the
    protected-resource metadata); the REST surfaces and the admin API refuse it (401) as a
    token minted for another audience, even one consented with the master key."""
    _, key_id = await create_api_key(stack.database_url)
    token = await oauth_token(stack, key_id)
    bearer = {"Authorization": f"Bearer {token}"}
    seen = await every_surface(stack, bearer)
    assert seen.pop("POST /mcp") == 200 and seen.pop("POST /mcp/remember-profile") == 200
    refused_everywhere(seen)
    master_token = await oauth_token(stack, None)
    assert await status(stack, "POST", "/mcp", [("Authorization", f"Bearer {master_token}"), *MCP_HEADERS.items()],
                        json=INITIALIZE) == 200
    for path in ("/keys", "/stats", "/export", "/logs/files", "/sessions", "/memory/fragments", "/activity"):
        assert await status(stack, "GET", f"{ADMIN}{path}", {"Authorization": f"Bearer {master_token}"}) == 401
    assert await status(stack, "GET", f"{MEMORY}/namespaces", {"Authorization": f"Bearer {master_token}"}) == 401
    assert await status(stack, "GET", "/api/memories", {"X-API-Key": master_token}) == 401


@pytest.mark.parametrize("change", ["inactive", "deleted"])
async def test_a_key_set_inactive_or_deleted_is_refused_everywhere(stack: Stack, change: str) -> None:
    key, key_id = await create_api_key(stack.database_url)
    bearer = {"Authorization": f"Bearer {key}"}
    before = await every_surface(stack, bearer)
    assert before.pop("GET admin/keys") == 403 and before.pop("WS ws") == 101
    assert before == dict.fromkeys(before, 200), before
    await (deactivate(stack, key_id) if change == "inactive" else delete_key(stack, key_id))
    refused_everywhere(await every_surface(stack, bearer) | {"GET admin/keys": 401})
    refused_everywhere({f"{m} {p}": await status(stack, m, p, {"X-API-Key": key}, **kw) for m, p, kw in REST_READS})
    assert await ws_status(stack, {"X-API-Key": key}) == 401


NS = str(uuid.uuid4())
MEMORY_WRITES = [
    ("POST", f"{MEMORY}/namespaces", {"json": {"name": "n"}}),
    ("PUT", f"{MEMORY}/namespaces/{NS}", {"json": {"name": "n"}}),
    ("DELETE", f"{MEMORY}/namespaces/{NS}", {}),
    ("PATCH", f"{MEMORY}/namespaces/{NS}/toggle", {"json": {"enabled": False}}),
    ("POST", f"{MEMORY}/namespaces/{NS}/entries", {"json": {"content": "c"}}),
    ("DELETE", f"{MEMORY}/namespaces/{NS}/entries", {}),
    ("POST", f"{MEMORY}/namespaces/{NS}/entries/bulk-delete", {"json": {"ids": ["x"]}}),
    ("POST", f"{MEMORY}/namespaces/{NS}/entries/move", {"json": {"ids": ["x"], "targetNamespaceId": NS}}),
    ("PUT", f"{MEMORY}/namespaces/{NS}/entries/x", {"json": {"content": "c"}}),
    ("DELETE", f"{MEMORY}/namespaces/{NS}/entries/x", {}),
    ("POST", f"{MEMORY}/import", {"json": {"data": "{}"}}),
    ("POST", f"{MEMORY}/extract", {"json": {"transcript": "user: hi"}}),
    ("POST", f"{MEMORY}/ensure-model-available", {"json": {}}),
    ("POST", f"{MEMORY}/namespaces/{NS}/consolidate", {"json": {}}),
    ("POST", f"{MEMORY}/consolidation/run", {}),
]
MNEMORY_WRITES = [
    ("POST", "/api/memories", {"json": {"content": "c"}}),
    ("POST", "/api/memories/batch", {"json": {"memories": [{"content": "c"}]}}),
    ("PUT", "/api/memories/m1", {"json": {"content": "c"}}),
    ("DELETE", "/api/memories/m1", {}),
    ("POST", "/api/memories/m1/artifacts", {"json": {"content": "c", "filename": "a.txt"}}),
    ("DELETE", "/api/memories/m1/artifacts/a1", {}),
    ("POST", "/api/remember", {"json": {"messages": [{"role": "user", "content": "hi"}]}}),
    ("DELETE", "/api/sessions/s1", {}),
    ("POST", "/api/sessions/s1/consolidate", {}),
    ("POST", "/api/fsck", {"json": {}}),
    ("POST", "/api/fsck/auto-run", {}),
    ("POST", "/api/fsck/c1/apply", {"json": {}}),
]


async def test_a_read_only_key_is_403_on_every_write_route(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url, permissions=["read"])
    for header in ({"X-API-Key": key}, {"Authorization": f"Bearer {key}"}):
        seen = {f"{m} {p}": await status(stack, m, p, header, **kw) for m, p, kw in MEMORY_WRITES + MNEMORY_WRITES}
        assert seen == dict.fromkeys(seen, 403), seen
    # ... and may read.
    assert await status(stack, "GET", f"{MEMORY}/namespaces", {"X-API-Key": key}) == 200
    assert await status(stack, "POST", "/api/memories/search", {"X-API-Key": key}, json={"query": "q"}) == 200


async def test_a_write_only_key_reads_nothing(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url, permissions=["write"])
    header = {"X-API-Key": key}
    for method, path, kw in REST_READS:
        assert await status(stack, method, path, header, **kw) == 403, path
    assert await ws_status(stack, header) == 403


async def test_allowed_workspaces_are_advisory_on_every_surface_as_on_mcp(stack: Stack) -> None:
    """Reference 000: `workspaceNotAllowed` is a warning that never refuses a write (MCP
    `remember` stores the fragment and says so in validation_warnings), and reads are not
    bounded by allowed_workspaces. A workspace is a part of one tenant, not a boundary between
    tenants. The REST surfaces match MCP: the write is stored in the key's default workspace
    (a fenced key without one writes unscoped, as `remember` does). Only the remember profile
    (reference 003) refuses, as its reference says (tests/remember_profile)."""
    fenced, fenced_id = await create_api_key(stack.database_url, allowed_workspaces=["allowed"])
    async with mcp_session(stack.mcp_url, fenced) as s:
        stored = await call(s, "remember", {"content": "An MCP fact outside the fence", "topic": "fence", "type": "fact"})
    assert stored.get("success") and "workspaceNotAllowed" in stored.get("validation_warnings", []), stored
    async with http(stack, {"X-API-Key": fenced}) as client:
        made = await client.post(f"{MEMORY}/namespaces", json={"name": unique("fenced"), "description": ""})
        assert made.status_code == 201, made.text
        entry = await client.post(f"{MEMORY}/namespaces/{made.json()['id']}/entries", json={"content": "A REST fact", "source": "manual"})
        assert entry.status_code == 201, entry.text
        added = await client.post("/api/memories", json={"content": "A mnemory fact outside the fence"})
        assert added.status_code == 200 and added.json()["results"], added.text
    conn = await asyncpg.connect(stack.database_url, server_settings={"search_path": SEARCH_PATH})
    try:
        rows = await conn.fetch("SELECT workspace, key_id FROM fragments WHERE id = ANY($1::text[])",
                                [stored["id"], entry.json()["id"], added.json()["results"][0]["id"]])
    finally:
        await conn.close()
    assert [(r["workspace"], r["key_id"]) for r in rows] == [(None, fenced_id)] * 3


async def test_raw_downloads_and_the_console_shell_are_not_cached(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with http(stack, {"X-API-Key": key}) as client:
        memory = (await client.post("/api/memories", json={"content": "The artifact's memory"})).json()["results"][0]["id"]
        art = await client.post(f"/api/memories/{memory}/artifacts", json={"content": "secret notes", "filename": "n.txt"})
        assert art.status_code == 200, art.text
        aid = art.json()["id"]
        raw = await client.get(f"/api/memories/{memory}/artifacts/{aid}/raw")
        token = (await client.post(f"/api/memories/{memory}/artifacts/{aid}/download-token")).json()["token"]
    async with http(stack) as anonymous:
        by_token = await anonymous.get(f"/api/memories/{memory}/artifacts/{aid}/raw", params={"token": token})
        shell = await anonymous.get(ADMIN)
    for reply in (raw, by_token):
        assert reply.status_code == 200 and reply.content == b"secret notes"
        assert "no-store" in reply.headers["cache-control"]
        assert reply.headers.get("referrer-policy") == "no-referrer"
    assert shell.status_code == 200 and shell.headers["cache-control"] in ("no-cache", "no-store")
    assert key not in shell.text and stack.master_key not in shell.text


async def test_an_uploaded_html_artifact_runs_nothing_on_the_gateway_origin(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    page = "<script>fetch('/v1/internal/model/nothing/keys')</script>"
    async with http(stack, {"X-API-Key": key}) as client:
        memory = (await client.post("/api/memories", json={"content": "A page as an artifact"})).json()["results"][0]["id"]
        art = await client.post(f"/api/memories/{memory}/artifacts",
                                json={"content": page, "filename": "p.html", "content_type": "text/html"})
        assert art.status_code == 200, art.text
        raw = await client.get(f"/api/memories/{memory}/artifacts/{art.json()['id']}/raw")
    assert raw.status_code == 200 and raw.text == page
    policy = raw.headers["content-security-policy"]
    assert "sandbox" in policy and "default-src 'none'" in policy
    assert raw.headers["x-content-type-options"] == "nosniff"
