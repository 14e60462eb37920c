"""ES256 JWTs with aud=mnemory on the mnemory REST surface (reference 004), verified by PyJWT
against the public key of a key pair made here (MNEMORY_JWT_PUBLIC_KEY) or a JWKS URL: a
valid token acts as the Engram key its `sub` names; an expired, wrong-audience, wrong-issuer
or wrongly signed token, `alg: none`, and an HS256 token keyed with the public key are all
refused, and so is a token whose key is inactive."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.stack.supervisor import ServiceProcess
from tests.gateway.conftest import Gateway, start_gateway
from tests.mnemory_api.helpers import add, api
from tests.support import Stack, create_api_key

ISSUER = "cognis"


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def signing_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def jwt_gateway(stack: Stack, signing_key: ec.EllipticCurvePrivateKey, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("jwt") / "cognis.pub.pem"
    path.write_bytes(_pem(signing_key))
    proc, gateway = start_gateway(stack, "gateway-mnemory-jwt", 8, {"MNEMORY_JWT_PUBLIC_KEY": str(path)})
    yield gateway
    proc.stop()


class _Jwks(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def jwks_gateway(stack: Stack, signing_key: ec.EllipticCurvePrivateKey) -> Iterator[Gateway]:
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(signing_key.public_key()))
    _Jwks.body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "ES256"}]}).encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc: ServiceProcess
    proc, gateway = start_gateway(stack, "gateway-mnemory-jwks", 9, {
        "MNEMORY_JWKS_URL": f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"})
    yield gateway
    proc.stop()
    server.shutdown()


def _token(key: Any, sub: str, *, algorithm: str = "ES256", headers: dict[str, Any] | None = None, **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": sub, "aud": "mnemory", "iss": ISSUER, "iat": now, "exp": now + 300, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=algorithm, headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_public_key(public_pem: bytes, sub: str) -> str:
    """The algorithm-confusion attack: HS256 keyed with the verifier's public key."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64(json.dumps({"sub": sub, "aud": "mnemory", "iss": ISSUER, "exp": int(time.time()) + 300}).encode())
    signature = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def _none(sub: str) -> str:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = _b64(json.dumps({"sub": sub, "aud": "mnemory", "iss": ISSUER, "exp": int(time.time()) + 300}).encode())
    return f"{header}.{payload}."


async def test_valid_token_acts_as_its_key_and_every_bad_one_is_refused(
    stack: Stack, jwt_gateway: Gateway, signing_key: ec.EllipticCurvePrivateKey
) -> None:
    key, key_id = await create_api_key(stack.database_url)
    async with api(jwt_gateway.url, key) as by_key:
        memory_id = await add(by_key, "User's favourite tea is a smoky lapsang souchong", memory_type="preference")
    good = _token(signing_key, key_id)
    async with api(jwt_gateway.url, good, header="bearer") as c:
        listed = (await c.get("/api/memories")).json()["results"]
        assert [m["id"] for m in listed] == [memory_id]
        written = await add(c, "User drinks the tea without milk or sugar", memory_type="preference")
    async with api(jwt_gateway.url, key) as by_key:
        assert written in [m["id"] for m in (await by_key.get("/api/memories")).json()["results"]]

    other = ec.generate_private_key(ec.SECP256R1())
    refused = {
        "expired": _token(signing_key, key_id, exp=int(time.time()) - 60),
        "no exp": _token(signing_key, key_id, exp=None),
        "wrong audience": _token(signing_key, key_id, aud="someone-else"),
        "wrong issuer": _token(signing_key, key_id, iss="mallory"),
        "wrong signature": _token(other, key_id),
        "alg none": _none(key_id),
        "hs256 keyed with the public key": _hs256_with_public_key(_pem(signing_key), key_id),
        "unknown key": _token(signing_key, "key-does-not-exist"),
        "no sub": _token(signing_key, ""),
    }
    for case, token in refused.items():
        async with api(jwt_gateway.url, token, header="bearer") as c:
            reply = await c.get("/api/memories")
            assert reply.status_code == 401, (case, reply.text)

    async with api(jwt_gateway.url, _token(signing_key, key_id, agent_id="bot-a"), header="bearer", agent="bot-b") as c:
        assert (await c.get("/api/memories")).status_code == 401  # X-Agent-Id must match the token's agent_id


async def test_token_of_an_inactive_key_is_refused(stack: Stack, jwt_gateway: Gateway, signing_key: ec.EllipticCurvePrivateKey) -> None:
    _, key_id = await create_api_key(stack.database_url, status="inactive")
    async with api(jwt_gateway.url, _token(signing_key, key_id), header="bearer") as c:
        assert (await c.get("/api/memories")).status_code == 401


async def test_jwks_url_verifies_tokens(stack: Stack, jwks_gateway: Gateway, signing_key: ec.EllipticCurvePrivateKey) -> None:
    _, key_id = await create_api_key(stack.database_url)
    async with api(jwks_gateway.url, _token(signing_key, key_id, headers={"kid": "k1"}), header="bearer") as c:
        assert (await c.get("/api/memories")).status_code == 200
    other = ec.generate_private_key(ec.SECP256R1())
    async with api(jwks_gateway.url, _token(other, key_id, headers={"kid": "k1"}), header="bearer") as c:
        assert (await c.get("/api/memories")).status_code == 401
    async with api(jwks_gateway.url, _token(signing_key, key_id, headers={"kid": "k1"}, aud="x"), header="bearer") as c:
        assert (await c.get("/api/memories")).status_code == 401
