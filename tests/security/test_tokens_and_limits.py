"""JWTs on the mnemory surface beyond tests/mnemory_api/test_jwt.py (kid / algorithm confusion
through a JWKS, a JWKS URL that points at a gateway, `sub` naming another tenant, a JWT on the
other surfaces), artifact download tokens used elsewhere and replayed after a delete, no token
or raw key in any log file, and per-key rate limits on every new route (X-API-Key, Bearer,
JWT and WebSocket handshakes in one window)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import websockets
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from websockets.exceptions import InvalidStatus

from services.stack.supervisor import ServiceProcess, Stack
from tests.gateway.conftest import Gateway, start_gateway
from tests.security.conftest import MEMORY, WAIT, deactivate, http
from tests.support import create_api_key, in_one_window

ISSUER = "cognis"
LIMIT = 8  # per key per minute on the rate-limit gateway


def _token(key: Any, sub: str, *, algorithm: str = "ES256", headers: dict[str, Any] | None = None) -> str:
    now = int(time.time())
    claims = {"sub": sub, "aud": "mnemory", "iss": ISSUER, "iat": now, "exp": now + 300}
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


@pytest.fixture(scope="module")
def signing_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


class _Jwks(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


HMAC_SECRET = b"a-symmetric-key-published-in-the-jwks"


@pytest.fixture(scope="module")
def jwks_gateway(stack: Stack, signing_key: ec.EllipticCurvePrivateKey) -> Iterator[Gateway]:
    """A JWKS holding the real EC key (kid k1) and, beside it, a symmetric key (kid k-oct):
    a token that names k-oct and signs HS256 with its bytes is the kid confusion to refuse."""
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(signing_key.public_key()))
    oct_key = {"kty": "oct", "kid": "k-oct", "k": base64.urlsafe_b64encode(HMAC_SECRET).rstrip(b"=").decode()}
    _Jwks.body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "ES256"}, oct_key]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc: ServiceProcess
    proc, gateway = start_gateway(stack, "gateway-security-jwks", 10, {
        "MNEMORY_JWKS_URL": f"http://127.0.0.1:{server.server_address[1]}/jwks.json", "MNEMORY_JWT_ISSUER": ISSUER})
    yield gateway
    proc.stop()
    server.shutdown()


@pytest.fixture(scope="module")
def limited_gateway(stack: Stack, signing_key: ec.EllipticCurvePrivateKey, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """JWTs by public key, and a per-key limit small enough to reach."""
    path: Path = tmp_path_factory.mktemp("security-jwt") / "issuer.pub.pem"
    path.write_bytes(signing_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    proc, gateway = start_gateway(stack, "gateway-security-limits", 11, {
        "MNEMORY_JWT_PUBLIC_KEY": str(path), "MNEMORY_JWT_ISSUER": ISSUER, "RATE_LIMIT_PER_KEY_PER_MIN": str(LIMIT)})
    yield gateway
    proc.stop()


@pytest.fixture(scope="module")
def self_jwks_gateway(stack: Stack) -> Iterator[Gateway]:
    """MNEMORY_JWKS_URL pointing at a gateway (the stack's, the same code): what it answers
    there is no key set, so every JWT is refused, and nothing loops or hangs."""
    proc, gateway = start_gateway(stack, "gateway-security-self-jwks", 12, {
        "MNEMORY_JWKS_URL": f"{stack.gateway_url}/api/memories", "MNEMORY_JWT_ISSUER": ISSUER})
    yield gateway
    proc.stop()


async def get_status(url: str, headers: dict[str, str], path: str = "/api/memories") -> int:
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=WAIT) as client:
        return (await client.get(path)).status_code


async def test_kid_and_algorithm_confusion_through_a_jwks(stack: Stack, jwks_gateway: Gateway,
                                                          signing_key: ec.EllipticCurvePrivateKey) -> None:
    _, key_id = await create_api_key(stack.database_url)
    url = jwks_gateway.url
    assert await get_status(url, {"Authorization": f"Bearer {_token(signing_key, key_id, headers={'kid': 'k1'})}"}) == 200
    confused = {
        "HS256 under the symmetric kid": _token(HMAC_SECRET, key_id, algorithm="HS256", headers={"kid": "k-oct"}),
        "ES256 naming the symmetric kid": _token(signing_key, key_id, headers={"kid": "k-oct"}),
        "unknown kid": _token(signing_key, key_id, headers={"kid": "k2"}),
        "no kid": _token(signing_key, key_id),
        "kid path traversal": _token(signing_key, key_id, headers={"kid": "../../etc/passwd"}),
    }
    for case, token in confused.items():
        assert await get_status(url, {"Authorization": f"Bearer {token}"}) == 401, case


async def test_a_jwks_url_at_a_gateway_refuses_every_jwt(stack: Stack, self_jwks_gateway: Gateway,
                                                         signing_key: ec.EllipticCurvePrivateKey) -> None:
    key, key_id = await create_api_key(stack.database_url)
    assert await get_status(self_jwks_gateway.url, {"Authorization": f"Bearer {_token(signing_key, key_id)}"}) == 401
    assert await get_status(self_jwks_gateway.url, {"X-API-Key": key}) == 200  # keys still work


async def test_jwt_sub_of_another_tenant_and_jwts_on_other_surfaces(stack: Stack, limited_gateway: Gateway,
                                                                    signing_key: ec.EllipticCurvePrivateKey) -> None:
    """`sub` names the key the token acts as: any tenant's, when the trusted issuer signed it
    (the issuer is trusted with every key it names). It is never the master key, and a JWT is
    a credential of the mnemory surface only."""
    a, a_id = await create_api_key(stack.database_url)
    b, b_id = await create_api_key(stack.database_url)
    async with httpx.AsyncClient(base_url=limited_gateway.url, headers={"X-API-Key": a}, timeout=WAIT) as client:
        mine = (await client.post("/api/memories", json={"content": "Tenant A's private fact"})).json()["results"][0]["id"]
    as_b = {"Authorization": f"Bearer {_token(signing_key, b_id)}"}
    async with httpx.AsyncClient(base_url=limited_gateway.url, headers=as_b, timeout=WAIT) as client:
        listed = await client.get("/api/memories")
        assert listed.status_code == 200 and mine not in listed.text
    for sub in ("master", "null", "*", ""):
        assert await get_status(limited_gateway.url, {"Authorization": f"Bearer {_token(signing_key, sub)}"}) == 401, sub
    token = {"Authorization": f"Bearer {_token(signing_key, a_id)}"}
    assert await get_status(limited_gateway.url, token, f"{MEMORY}/namespaces") == 401
    assert await get_status(limited_gateway.url, token, "/v1/internal/model/nothing/keys") == 401
    url = limited_gateway.url.replace("http://", "ws://") + f"{MEMORY}/ws"
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(url, additional_headers=token, open_timeout=WAIT):
            pass
    assert refused.value.response.status_code == 401
    # A JWT of a key set inactive is refused at once (the key cache's generation moved).
    await deactivate(stack, a_id)
    assert await get_status(limited_gateway.url, token) == 401


async def test_every_new_route_counts_in_its_keys_window(stack: Stack, limited_gateway: Gateway,
                                                         signing_key: ec.EllipticCurvePrivateKey) -> None:
    """X-API-Key and Bearer on both REST APIs, the SSE stream, a JWT and a WebSocket handshake
    of one key share one per-minute window; past it each answers 429 (the WebSocket's
    handshake too). The window may start mid-minute: at most LIMIT are let through.

    The windows are fixed minutes, so a run that crosses a minute's end meets two windows and
    may see up to 2 * LIMIT let through: such a run is repeated with a fresh key."""
    url = limited_gateway.url
    ws_url = url.replace("http://", "ws://") + f"{MEMORY}/ws"

    async def attempt_all() -> list[int]:
        key, key_id = await create_api_key(stack.database_url)
        jwt_headers = {"Authorization": f"Bearer {_token(signing_key, key_id)}"}

        async def ws() -> int:
            try:
                async with websockets.connect(ws_url, additional_headers={"X-API-Key": key}, open_timeout=WAIT):
                    return 200
            except InvalidStatus as refused:
                return refused.response.status_code

        attempts = [
            lambda: get_status(url, {"X-API-Key": key}, f"{MEMORY}/namespaces"),
            lambda: get_status(url, {"Authorization": f"Bearer {key}"}, "/api/categories"),
            lambda: get_status(url, jwt_headers),
            ws,
        ]
        return [await attempts[i % len(attempts)]() for i in range(3 * LIMIT)]

    seen = await in_one_window(attempt_all)
    assert set(seen) <= {200, 429} and 0 < seen.count(200) <= LIMIT, seen
    # Once refused, every way in of the key (the last four, one of each) is refused within the window.
    assert seen[-4:] == [429] * 4, seen


async def test_download_tokens_elsewhere_after_deletes_and_after_the_key(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    async with http(stack, {"X-API-Key": key}) as client:
        memory = (await client.post("/api/memories", json={"content": "A memory with files"})).json()["results"][0]["id"]
        arts = [(await client.post(f"/api/memories/{memory}/artifacts", json={"content": f"file {i}"})).json()["id"] for i in range(2)]
        grants = [(await client.post(f"/api/memories/{memory}/artifacts/{a}/download-token")).json() for a in arts]
    async with http(stack) as anonymous:
        token = grants[0]["token"]
        # Another route: the token is no credential anywhere but the raw download.
        for path in (f"/api/memories/{memory}/artifacts/{arts[0]}", f"/api/memories/{memory}/artifacts", "/api/memories"):
            assert (await anonymous.get(path, params={"token": token})).status_code == 401, path
            assert (await anonymous.get(path, headers={"Authorization": f"Bearer {token}"})).status_code == 401, path
        assert (await anonymous.get(f"{MEMORY}/namespaces", headers={"X-API-Key": token})).status_code == 401
        assert (await anonymous.delete(f"/api/memories/{memory}/artifacts/{arts[0]}", params={"token": token})).status_code == 401
        ok = await anonymous.get(grants[0]["url"])
        assert ok.status_code == 200 and ok.content == b"file 0"
        # Replayed after its artifact was deleted, then after the memory was.
        async with http(stack, {"X-API-Key": key}) as client:
            assert (await client.delete(f"/api/memories/{memory}/artifacts/{arts[0]}")).status_code == 200
        gone = await anonymous.get(grants[0]["url"])
        assert gone.status_code == 404, gone.text
        assert (await anonymous.get(grants[1]["url"])).status_code == 200
        await deactivate(stack, key_id)
        assert (await anonymous.get(grants[1]["url"])).status_code == 401
        await http(stack).aclose()
    async with http(stack, {"X-API-Key": stack.master_key}) as master:
        assert (await master.delete(f"/api/memories/{memory}")).status_code == 200
    await stack_activate(stack, key_id)
    async with http(stack) as anonymous:
        assert (await anonymous.get(grants[1]["url"])).status_code == 404


async def stack_activate(stack: Stack, key_id: str) -> None:
    from tests.security.conftest import admin

    await admin(stack, "PUT", f"/keys/{key_id}", json={"status": "active"})


def test_no_log_file_holds_a_token_or_a_raw_key(stack: Stack) -> None:
    """Runs last in this package's files (pytest's order): every credential the tests above
    used went through the stack; none of them, nor any download token, appears in a log."""
    files = [p for p in Path(stack.log_dir).rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        for marker in ("mmcp_", "oat_", "token=ey", "Bearer ey", stack.master_key):
            assert marker not in text, (path.name, marker)
