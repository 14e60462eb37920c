"""OAuth consent needs a resource owner: a code only for someone who proves the client's key
(or the master key) on Engram's own consent page, through a form that carries a CSRF token
bound to the authorization request and to the browser that opened it. Also: the documented
hosted-client callback admitted exactly, /register's limits, an identical redirect_uri at
/token, wrong keys throttled, and tokens that die with their key."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.gateway.conftest import Gateway, start_gateway
from tests.gateway.test_oauth import REDIRECT, _token, auth_params, consent_form, csrf_field, pkce, register
from tests.gateway.wire import ACCEPT, INIT, db
from tests.support import Stack, call, create_api_key, mcp_session, unique

CLAUDE_CALLBACK = "https://claude.ai/api/mcp/auth_callback"
ADMIN = "/v1/internal/model/nothing"


def no_code(response: httpx.Response) -> bool:
    return response.status_code != 302 and "location" not in response.headers and "code=" not in response.text


async def allow(http: httpx.AsyncClient, url: str, form: dict[str, str], key: str | None = None) -> httpx.Response:
    data = {**form, "decision": "allow", **({"access_key": key} if key is not None else {})}
    return await http.post(f"{url}/authorize", data=data)


def code_of(response: httpx.Response) -> str:
    assert response.status_code == 302, response.text
    query = parse_qs(urlparse(response.headers["location"]).query)
    assert query["state"] == ["st-1"]
    return query["code"][0]


async def remember(key: str, stack: Stack, content: str, ws: str) -> dict:  # type: ignore[type-arg]
    async with mcp_session(stack.mcp_url, key) as s:
        return await call(s, "remember", {"content": content, "topic": "notes", "type": "fact", "workspace": ws})


async def consented_token(http: httpx.AsyncClient, stack: Stack, client_id: str, key: str) -> str:
    """The whole flow as a person does it: open the page, type `key`, allow, exchange the code."""
    verifier, challenge = pkce()
    form = await consent_form(http, stack, auth_params(client_id, challenge))
    token = await _token(http, stack, client_id, code_of(await allow(http, stack.gateway_url, form, key)), verifier)
    assert token.status_code == 200, token.text
    return str(token.json()["access_token"])


async def mcp_status(url: str, token: str) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.post(url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {token}"})).status_code


async def test_a_key_bound_client_needs_its_own_key_at_consent(stack: Stack) -> None:
    raw_a, key_a = await create_api_key(stack.database_url)
    raw_b, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("kestrel")
    mine = await remember(raw_a, stack, f"The {marker} ledger closes on Fridays.", ws)
    theirs = await remember(raw_b, stack, f"The {marker} ledger closes on Tuesdays.", ws)
    async with httpx.AsyncClient() as attacker:
        # The client id is public (`<name>_<keyIdHex8>`): anyone can address A's client.
        client_id = (await register(attacker, stack, raw_a, client_name="agent")).json()["client_id"]
        assert client_id == f"agent_{key_a[:8]}"
        verifier, challenge = pkce()
        params = auth_params(client_id, challenge)
        form = await consent_form(attacker, stack, params)
        url = stack.gateway_url

        no_key = await allow(attacker, url, form)
        assert no_key.status_code == 401 and no_code(no_key)
        other_key = await allow(attacker, url, form, raw_b)
        assert other_key.status_code == 403 and no_code(other_key)
        bad_key = await allow(attacker, url, form, "mmcp_" + secrets.token_hex(16))
        assert bad_key.status_code == 401 and no_code(bad_key)

        # The right key, but without a CSRF token we issued for this request and this browser.
        expiry, nonce, mac = form["csrf_token"].split(".")
        forged = f"{expiry}.{nonce}.{secrets.token_hex(32)}"
        longer = f"{int(expiry) + 86400}.{nonce}.{mac}"
        for token in (None, "", forged, longer, "1.x.y"):
            tampered = {k: v for k, v in form.items() if k != "csrf_token"} | ({"csrf_token": token} if token is not None else {})
            refused = await allow(attacker, url, tampered, raw_a)
            assert refused.status_code == 403 and no_code(refused), token
        _, other_challenge = pkce()
        swapped = await allow(attacker, url, {**form, "code_challenge": other_challenge}, raw_a)  # another request's token
        assert swapped.status_code == 403 and no_code(swapped)
        async with httpx.AsyncClient() as other_browser:  # a token fetched by someone else: no cookie here
            cross_site = await allow(other_browser, url, form, raw_a)
        assert cross_site.status_code == 403 and no_code(cross_site)

        code = code_of(await allow(attacker, url, form, raw_a))
        token = await _token(attacker, stack, client_id, code, verifier)
        assert token.status_code == 200, token.text
        access = token.json()["access_token"]
    async with mcp_session(stack.mcp_url, access) as s:
        found = await call(s, "recall", {"keywords": [marker], "workspace": ws})
    ids = [f["id"] for f in found["fragments"]]
    assert mine["id"] in ids and theirs["id"] not in ids, found
    assert {f.get("key_id") for f in found["fragments"]} == {key_a}, found


async def test_the_consent_cookie_stays_on_this_site(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        _, challenge = pkce()
        url, params = f"{stack.gateway_url}/authorize", auth_params(client_id, challenge)
        plain = (await http.get(url, params=params)).headers["set-cookie"].lower()
        assert plain.startswith("engram_consent=") and "httponly" in plain and "samesite=strict" in plain
        behind_tls = (await http.get(url, params=params, headers={"X-Forwarded-Proto": "https"})).headers["set-cookie"].lower()
        assert behind_tls.startswith("__host-engram_consent=") and "secure" in behind_tls and "path=/;" in behind_tls
        assert "domain=" not in behind_tls and "samesite=strict" in behind_tls


async def test_an_access_token_cannot_consent_or_bind(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack, raw, client_name="tok")).json()["client_id"]
        access = await consented_token(http, stack, client_id, raw)
        assert await mcp_status(stack.mcp_url, access) == 200
        # The token must not mint tokens that outlive it, nor re-bind the key's client.
        _, challenge2 = pkce()
        form2 = await consent_form(http, stack, auth_params(client_id, challenge2))
        refused = await allow(http, stack.gateway_url, form2, access)
        assert refused.status_code == 401 and no_code(refused)
        assert (await register(http, stack, access, client_name="tok")).status_code == 401


async def test_the_master_key_consents_for_a_bound_client_as_that_key(stack: Stack) -> None:
    raw_a, key_a = await create_api_key(stack.database_url)
    raw_b, _ = await create_api_key(stack.database_url)
    ws, marker = unique(), unique("osprey")
    theirs = await remember(raw_b, stack, f"The {marker} rota changes in spring.", ws)
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack, raw_a, client_name="ops")).json()["client_id"]
        access = await consented_token(http, stack, client_id, stack.master_key)
    # Not a master token: B's fragment (a master token would read it) stays out of reach.
    async with mcp_session(stack.mcp_url, access) as s:
        found = await call(s, "recall", {"keywords": [marker], "workspace": ws})
        active = await s.read_resource("memory://active-session")
    assert theirs["id"] not in [f["id"] for f in found["fragments"]], found
    assert f'"keyId": "{key_a}"' in active.contents[0].text


async def test_default_allow_list_admits_the_documented_callback_exactly(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        hosted = await register(http, stack, redirect_uris=[CLAUDE_CALLBACK])
        assert hosted.status_code == 201, hosted.text
        for uri in (
            f"{CLAUDE_CALLBACK}/../x", f"{CLAUDE_CALLBACK}X", f"{CLAUDE_CALLBACK}/", f"{CLAUDE_CALLBACK}?next=1",
            "https://evil.claude.ai/api/mcp/auth_callback", "http://claude.ai/api/mcp/auth_callback",
            "https://claude.ai/api/mcp/other", "https://claude.ai.evil.com/api/mcp/auth_callback",
        ):
            refused = await register(http, stack, redirect_uris=[uri])
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_redirect_uri", uri
        # /authorize matches the registered URI exactly too.
        client_id = hosted.json()["client_id"]
        _, challenge = pkce()
        hosted_params = auth_params(client_id, challenge, redirect_uri=CLAUDE_CALLBACK)
        assert (await http.get(f"{stack.gateway_url}/authorize", params=hosted_params)).status_code == 200
        for uri in (f"{CLAUDE_CALLBACK}/../auth_callback", f"{CLAUDE_CALLBACK}/"):
            moved = await http.get(f"{stack.gateway_url}/authorize", params=auth_params(client_id, challenge, redirect_uri=uri))
            assert moved.status_code == 400, uri


async def test_registration_limits(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        assert (await register(http, stack, client_name="n" * 200)).status_code == 201
        for body in ({"client_name": "n" * 201}, {"client_name": 7}, {"client_name": "a\x00b"}, {"scope": "x" * 5000}, {"scope": "\x00"}):
            refused = await register(http, stack, **body)
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata", body
        for uris in ([f"http://localhost:{9000 + i}/cb" for i in range(11)], ["http://localhost:8976/\x00"]):
            refused = await register(http, stack, redirect_uris=uris)
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_redirect_uri", uris
        # Values Postgres cannot hold are refused as bad requests, never reach SQL as a 500.
        client_id = (await register(http, stack)).json()["client_id"]
        _, challenge = pkce()
        for bad in ({"client_id": "x\x00"}, {"code_challenge": "short"}, {"code_challenge": challenge[:-1] + "\x00"},
                    {"resource": "https://r/\x00"}):
            response = await http.get(f"{stack.gateway_url}/authorize", params={**auth_params(client_id, challenge), **bad})
            assert response.status_code == 400, bad
        token = await http.post(f"{stack.gateway_url}/token", data={
            "grant_type": "authorization_code", "code": "c", "client_id": "x\x00", "code_verifier": "v" * 43, "redirect_uri": REDIRECT})
        assert token.status_code in (400, 401) and "error" in token.json()


async def test_a_client_registered_without_a_key_or_with_the_master_key_still_needs_a_key(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        for bearer in (None, stack.master_key):
            registered = (await register(http, stack, bearer)).json()
            assert registered["client_id"].startswith("mmcp_")  # random: bound to no key
            _, challenge = pkce()
            form = await consent_form(http, stack, auth_params(registered["client_id"], challenge))
            refused = await allow(http, stack.gateway_url, form)
            assert refused.status_code == 401 and no_code(refused)
            assert code_of(await allow(http, stack.gateway_url, form, stack.master_key))


async def test_a_bound_client_id_stays_with_its_key(stack: Stack) -> None:
    # Two keys whose ids share the eight hex digits a bound client id names.
    raw_a, key_a = await create_api_key(stack.database_url)
    raw_b, key_b = await create_api_key(stack.database_url)
    prefix = secrets.token_hex(4)
    async with db(stack) as conn:
        await conn.execute("UPDATE api_keys SET id = $2 WHERE id = $1", key_a, f"{prefix}00000001")
        await conn.execute("UPDATE api_keys SET id = $2 WHERE id = $1", key_b, f"{prefix}00000002")
    async with httpx.AsyncClient() as http:
        first = await register(http, stack, raw_a, client_name="twin")
        assert first.status_code == 201 and first.json()["client_id"] == f"twin_{prefix}"
        taken = await register(http, stack, raw_b, client_name="twin", redirect_uris=["http://localhost:1/steal"])
        assert taken.status_code == 400 and taken.json()["error"] == "invalid_client_metadata"
        _, challenge = pkce()
        page = await http.get(f"{stack.gateway_url}/authorize", params=auth_params(f"twin_{prefix}", challenge))
        assert page.status_code == 200  # still A's client, with A's redirect URI
        again = await register(http, stack, raw_a, client_name="twin")
        assert again.status_code == 201  # its own key may register it again


async def test_token_redirect_uri_must_be_identical(stack: Stack) -> None:
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack)).json()["client_id"]
        verifier, challenge = pkce()
        form = await consent_form(http, stack, auth_params(client_id, challenge))
        code = code_of(await allow(http, stack.gateway_url, form, stack.master_key))
        # The same URL after normalisation, but not the same string (RFC 6749 §4.1.3).
        for uri in ("http://localhost:8976/x/../callback", "HTTP://LOCALHOST:8976/callback"):
            refused = await _token(http, stack, client_id, code, verifier, uri)
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant", uri
        assert (await _token(http, stack, client_id, code, verifier, REDIRECT)).status_code == 200


async def test_a_token_dies_with_its_key(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack, raw, client_name="mortal")).json()["client_id"]
        access = await consented_token(http, stack, client_id, raw)
    assert await mcp_status(stack.mcp_url, access) == 200
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, headers={"Authorization": f"Bearer {stack.master_key}"}) as admin:
        assert (await admin.put(f"/keys/{key_id}", json={"status": "inactive"})).status_code == 200
        assert await mcp_status(stack.mcp_url, access) == 401
        assert (await admin.put(f"/keys/{key_id}", json={"status": "active"})).status_code == 200
        assert await mcp_status(stack.mcp_url, access) == 200
        assert (await admin.delete(f"/keys/{key_id}")).status_code == 200
        assert await mcp_status(stack.mcp_url, access) == 401


async def test_a_replayed_code_revokes_its_token(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    async with httpx.AsyncClient() as http:
        client_id = (await register(http, stack, raw, client_name="replay")).json()["client_id"]
        verifier, challenge = pkce()
        form = await consent_form(http, stack, auth_params(client_id, challenge))
        code = code_of(await allow(http, stack.gateway_url, form, raw))
        access = (await _token(http, stack, client_id, code, verifier)).json()["access_token"]
        assert await mcp_status(stack.mcp_url, access) == 200
        # RFC 6749 §4.1.2: the code comes back (someone else had it too): refused, and the token
        # issued from it no longer works.
        again = await _token(http, stack, client_id, code, verifier)
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert await mcp_status(stack.mcp_url, access) == 401
    async with httpx.AsyncClient() as http:
        other = await consented_token(http, stack, client_id, raw)  # a fresh consent still works
    assert await mcp_status(stack.mcp_url, other) == 200


@pytest.fixture(scope="module")
def consent_gateway(stack: Stack) -> Iterator[Gateway]:
    """Three wrong keys a minute at the consent form; its own Redis database, so its counters
    meet no other gateway's."""
    proc, gateway = start_gateway(stack, "gateway-consent", 9, {"OAUTH_CONSENT_FAILURES_PER_MIN": "3"})
    yield gateway
    proc.stop()


async def test_wrong_keys_at_consent_are_throttled(stack: Stack, consent_gateway: Gateway) -> None:
    raw, _ = await create_api_key(stack.database_url)
    url = consent_gateway.url
    # The limit counts in one-minute windows; start early in one so all attempts share it.
    if time.time() % 60 > 45:
        await asyncio.sleep(61 - time.time() % 60)
    async with httpx.AsyncClient() as http:
        client_id = (await http.post(f"{url}/register", json={"client_name": "slow", "redirect_uris": [REDIRECT]},
                                     headers={"Authorization": f"Bearer {raw}"})).json()["client_id"]
        _, challenge = pkce()
        page = await http.get(f"{url}/authorize", params=auth_params(client_id, challenge))
        form = {**auth_params(client_id, challenge), "csrf_token": csrf_field(page)}
        for _ in range(3):
            wrong = await allow(http, url, form, "mmcp_" + secrets.token_hex(16))
            assert wrong.status_code == 401 and no_code(wrong)
        # Past the limit even the right key gets no code (a guesser learns nothing) until the minute ends.
        throttled = await allow(http, url, form, raw)
        assert throttled.status_code == 429 and no_code(throttled)
        assert int(throttled.headers["retry-after"]) >= 1
        # A deny is not a guess: it still answers.
        denied = await http.post(f"{url}/authorize", data={**form, "decision": "deny"})
        assert denied.status_code == 302 and "error=access_denied" in denied.headers["location"]
