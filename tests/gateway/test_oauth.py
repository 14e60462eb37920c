"""OAuth 2.0: metadata, registration (with API-key binding), consent with PKCE S256,
single-use codes, verifier and redirect checks, and a tool call with the issued token."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.support import Stack, call, create_api_key, mcp_session, unique

REDIRECT = "http://localhost:8976/callback"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


async def register(http: httpx.AsyncClient, stack: Stack, key: str | None = None, **body) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return await http.post(f"{stack.gateway_url}/register", json={"client_name": "Claude", "redirect_uris": [REDIRECT], **body}, headers=headers)


def auth_params(client_id: str, challenge: str, **extra: str) -> dict[str, str]:
    return {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "code_challenge": challenge,
            "code_challenge_method": "S256", "state": "st-1", **extra}


async def test_metadata_documents(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        meta = (await http.get(f"{stack.gateway_url}/.well-known/oauth-authorization-server")).json()
        base = stack.gateway_url
        assert meta["issuer"] == base
        assert meta["authorization_endpoint"] == f"{base}/authorize" and meta["token_endpoint"] == f"{base}/token"
        assert meta["registration_endpoint"] == f"{base}/register"
        assert meta["response_types_supported"] == ["code"] and meta["grant_types_supported"] == ["authorization_code"]
        assert meta["code_challenge_methods_supported"] == ["S256"]
        resource = (await http.get(f"{base}/.well-known/oauth-protected-resource")).json()
        assert resource["resource"] == f"{base}/mcp" and resource["authorization_servers"] == [base]
        unauth = await http.post(stack.mcp_url, json={})
        assert unauth.headers["www-authenticate"] == f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource"'


async def test_registration(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient() as http:
        anonymous = await register(http, stack)
        assert anonymous.status_code == 201
        body = anonymous.json()
        assert body["client_id"].startswith("mmcp_") and body["client_name"] == "Claude"
        assert body["redirect_uris"] == [REDIRECT] and body["grant_types"] == ["authorization_code"]
        assert body["token_endpoint_auth_method"] == "none"
        bound = (await register(http, stack, raw, client_name="My Agent")).json()
        assert bound["client_id"] == f"My-Agent_{key_id[:8]}"
        assert (await register(http, stack, "mmcp_wrong")).status_code == 401
        for uri in ("http://localhost.evil.com/cb", "not a uri", "http://localhost:8976/cb#fragment"):
            refused = await register(http, stack, redirect_uris=[uri])
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_redirect_uri"
        assert (await register(http, stack, redirect_uris=[])).status_code == 400


async def test_authorize_requires_pkce_s256_and_known_redirects(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        _, challenge = pkce()
        page = await http.get(f"{stack.gateway_url}/authorize", params=auth_params(client_id, challenge))
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert 'name="decision" value="allow"' in page.text and 'name="decision" value="deny"' in page.text
        for bad in (
            {"code_challenge_method": "plain"}, {"code_challenge": ""}, {"response_type": "token"},
            {"redirect_uri": "http://localhost:1/other"}, {"client_id": "nobody"},
        ):
            response = await http.get(f"{stack.gateway_url}/authorize", params={**auth_params(client_id, challenge), **bad})
            assert response.status_code == 400, bad
        params = auth_params(client_id, challenge)
        params.pop("code_challenge_method")
        assert (await http.get(f"{stack.gateway_url}/authorize", params=params)).status_code == 400


async def test_deny_redirects_with_access_denied(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        _, challenge = pkce()
        denied = await http.post(f"{stack.gateway_url}/authorize", data={**auth_params(client_id, challenge), "decision": "deny"})
        assert denied.status_code == 302
        location = urlparse(denied.headers["location"])
        assert f"{location.scheme}://{location.netloc}{location.path}" == REDIRECT
        assert parse_qs(location.query) == {"error": ["access_denied"], "state": ["st-1"]}


def csrf_field(page: httpx.Response) -> str:
    """The consent form's hidden CSRF token, read the way a browser submits it."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found, page.text
    return found[1]


async def consent_form(http: httpx.AsyncClient, stack: Stack, params: dict[str, str]) -> dict[str, str]:
    """Open the consent page (its cookie stays in `http`) and return the form it asks to post back."""
    page = await http.get(f"{stack.gateway_url}/authorize", params=params)
    assert page.status_code == 200, page.text
    return {**params, "csrf_token": csrf_field(page)}


async def _code(http: httpx.AsyncClient, stack: Stack, client_id: str, challenge: str, access_key: str) -> str:
    form = await consent_form(http, stack, auth_params(client_id, challenge))
    allowed = await http.post(f"{stack.gateway_url}/authorize", data={**form, "decision": "allow", "access_key": access_key})
    assert allowed.status_code == 302, allowed.text
    query = parse_qs(urlparse(allowed.headers["location"]).query)
    assert query["state"] == ["st-1"]
    return query["code"][0]


async def _token(http: httpx.AsyncClient, stack: Stack, client_id: str, code: str, verifier: str, redirect: str = REDIRECT) -> httpx.Response:
    return await http.post(f"{stack.gateway_url}/token", data={
        "grant_type": "authorization_code", "code": code, "client_id": client_id, "code_verifier": verifier, "redirect_uri": redirect,
    })


async def test_bound_client_flow_restores_the_key_tenant(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("heron")
    async with mcp_session(stack.mcp_url, raw) as s:
        stored = await call(s, "remember", {"content": f"The {marker} pipeline exports reports every Monday.", "topic": "reports", "type": "fact", "workspace": ws})
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack, raw, client_name="agent")).json()["client_id"]
        verifier, challenge = pkce()
        page = await http.get(f"{stack.gateway_url}/authorize", params=auth_params(client_id, challenge))
        assert key_id[:8] in page.text and 'name="access_key"' in page.text
        code = await _code(http, stack, client_id, challenge, access_key=raw)
        assert (await _token(http, stack, client_id, code, "wrong-verifier-" + "x" * 40)).json()["error"] == "invalid_grant"
        assert (await _token(http, stack, client_id, code, verifier, "http://localhost:8976/elsewhere")).status_code == 400
        token = await _token(http, stack, client_id, code, verifier)
        assert token.status_code == 200, token.text
        body = token.json()
        assert body["token_type"] == "Bearer" and body["expires_in"] > 0
        access = body["access_token"]
    async with mcp_session(stack.mcp_url, access) as s:
        found = await call(s, "recall", {"keywords": [marker], "workspace": ws})
    assert stored["id"] in [f["id"] for f in found["fragments"]], found
    assert {f.get("key_id") for f in found["fragments"]} == {key_id}, found
    async with httpx.AsyncClient() as http:
        # single use (and the replay revokes the token: tests/gateway/test_oauth_consent.py)
        again = await _token(http, stack, client_id, code, verifier)
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant"


async def test_unbound_client_needs_a_key_at_consent(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url, permissions=["read"])
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        verifier, challenge = pkce()
        form = await consent_form(http, stack, auth_params(client_id, challenge))
        refused = await http.post(f"{stack.gateway_url}/authorize", data={**form, "decision": "allow"})
        assert refused.status_code == 401 and "location" not in refused.headers
        assert 'name="access_key"' in refused.text  # the page again, to try once more
        code = await _code(http, stack, client_id, challenge, access_key=raw)
        access = (await _token(http, stack, client_id, code, verifier)).json()["access_token"]
    async with mcp_session(stack.mcp_url, access) as s:
        await s.call_tool("memory_stats", {})
        # the token carries the key's permissions: read only
        from mcp.shared.exceptions import MCPError

        with pytest.raises(MCPError) as denied:
            await s.call_tool("remember", {"content": "OAuth read-only tokens cannot write this.", "topic": "t", "type": "fact"})
        assert denied.value.error.message == "Internal error"


async def test_expired_code_is_refused(stack: Stack) -> None:
    from tests.gateway.wire import db

    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        verifier, challenge = pkce()
        code = await _code(http, stack, client_id, challenge, access_key=stack.master_key)
        async with db(stack) as conn:
            await conn.execute("UPDATE oauth_codes SET expires_at = now() - interval '1 second' WHERE client_id = $1", client_id)
        expired = await _token(http, stack, client_id, code, verifier)
        assert expired.status_code == 400 and expired.json()["error"] == "invalid_grant"
