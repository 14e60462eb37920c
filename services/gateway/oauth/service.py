"""OAuth 2.0 for MCP clients: RFC 8414 / RFC 9728 metadata, RFC 7591 registration (with API
key binding), a consent page with PKCE S256, and the token endpoint.

seed: `POST /register` with an API-key Bearer names the client `<name>_<keyIdHex8>` and the
key's tenant is restored at /authorize; without it the client id is random. `GET /authorize`
renders consent, `POST /authorize` takes decision=allow|deny. A code is issued only to someone
who proves the key at the consent form (services/gateway/oauth_consent.py says who may). Redirect
URIs must be on an allow-list: localhost origins, plus hosted clients' callbacks matched
exactly. The token exchange (code single-use and short-lived, PKCE verifier, redirect URI
identical to /authorize's) runs through the SDK's TokenHandler over our provider.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlparse

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import ClientAuthenticator
from mcp.server.auth.provider import AccessToken, AuthorizationCode, AuthorizationParams, RefreshToken, TokenError
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl
from starlette.routing import Route

from services.gateway.core.auth import OAUTH_TOKEN_PREFIX as TOKEN_PREFIX
from services.gateway.core.auth import Authenticator, bearer_token
from services.gateway.core.limits import RateLimiter
from services.gateway.core.state import gateway_state, state_of
from services.gateway.oauth.consent import CSRF_FIELD, KEY_FIELD, ConsentCsrf, ConsentRefused, consent_page, consenting_key, cookie_name
from shared.repositories import oauth as oauth_repo
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

MASTER_SUBJECT = "master"
# /register limits: the endpoint takes unauthenticated requests, and what it accepts is stored.
MAX_CLIENT_NAME_CHARS = 200
MAX_REDIRECT_URIS = 10
MAX_REDIRECT_URI_CHARS = 2000
MAX_METADATA_CHARS = 4000
MAX_RESOURCE_CHARS = 2000
# Postgres text cannot hold NUL (a 500 where a 400 belongs), and no OAuth value needs a control character.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# RFC 7636 §4.2: an S256 challenge is BASE64URL(SHA-256(verifier)) without padding, 43 characters.
_S256_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
# RFC 7591 §2 client metadata kept beside the name and redirect URIs; anything else is ignored
# (the RFC lets a server ignore what it does not understand).
KEPT_METADATA = (
    "grant_types", "response_types", "token_endpoint_auth_method", "scope", "client_uri", "logo_uri",
    "contacts", "tos_uri", "policy_uri", "software_id", "software_version",
)


def base_url(request: Request) -> str:
    scheme = request.headers.get("x-forwarded-proto", request.url.scheme)
    return f"{scheme}://{request.headers.get('host', request.url.netloc)}"


def redirect_allowed(uri: str, allowlist: list[str], exact: list[str]) -> bool:
    """Equal to an exact entry, or the same scheme and host as an origin entry of the allow-list
    (and its port, when the entry names one)."""
    if _CONTROL.search(uri):
        return False
    if uri in exact:
        return True
    if "#" in uri:  # RFC 6749 §3.1.2: a redirection endpoint URI has no fragment
        return False
    try:
        candidate = urlparse(uri)
        candidate_port = candidate.port
    except ValueError:
        return False
    for entry in allowlist:
        allowed = urlparse(entry)
        if candidate.scheme != allowed.scheme or candidate.hostname != allowed.hostname:
            continue
        if allowed.port is None or allowed.port == candidate_port:
            return True
    return False


@dataclass(frozen=True)
class RegisteredClient:
    client_id: str
    redirect_uris: tuple[str, ...]  # as registered, compared exactly
    key_id: str | None  # the API key whose Bearer registered it


class OAuthService:
    """Our OAuthAuthorizationServerProvider (the parts the SDK's token handler calls)."""

    def __init__(self, pool: asyncpg.Pool, settings: GatewaySettings, authenticator: Authenticator) -> None:
        self.pool = pool
        self.settings = settings
        self.authenticator = authenticator
        self.csrf = ConsentCsrf(settings.access_key)

    async def _client_row(self, client_id: str) -> asyncpg.Record | None:
        if _CONTROL.search(client_id):  # Postgres cannot hold it; no client has it
            return None
        async with self.pool.acquire() as conn:
            return await oauth_repo.get_client(conn, client_id)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        row = await self._client_row(client_id)
        if row is None:
            return None
        return OAuthClientInformationFull(
            client_id=row["client_id"], client_name=row["client_name"], redirect_uris=[AnyUrl(u) for u in row["redirect_uris"]],
            token_endpoint_auth_method="none",  # noqa: S106 - public clients (PKCE), not a secret
            grant_types=["authorization_code"], response_types=["code"],
        )

    async def registered(self, client_id: str) -> RegisteredClient | None:
        row = await self._client_row(client_id)
        if row is None:
            return None
        return RegisteredClient(row["client_id"], tuple(row["redirect_uris"]), row["key_id"])

    async def code_redirect_uri(self, code: str, client_id: str) -> str | None:
        """The redirect URI an unused code was issued for, as given at /authorize."""
        if _CONTROL.search(client_id):
            return None
        async with self.pool.acquire() as conn:
            row = await oauth_repo.get_unused_code(conn, code, client_id)
        return row["redirect_uri"] if row else None

    async def issue_code(self, client_id: str, key_id: str | None, redirect_uri: str, challenge: str, resource: str | None) -> str:
        code = secrets.token_urlsafe(32)
        async with self.pool.acquire() as conn:
            await oauth_repo.create_code(
                conn, code=code, client_id=client_id, key_id=key_id, redirect_uri=redirect_uri, code_challenge=challenge,
                scopes=[], resource=resource, expires_at=datetime.now(UTC) + self.settings.oauth_code_ttl,
            )
        return code

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str) -> AuthorizationCode | None:
        async with self.pool.acquire() as conn:
            row = await oauth_repo.get_code(conn, authorization_code, str(client.client_id))
            revoked = await oauth_repo.revoke_tokens_of_code(conn, authorization_code) if row and row["used_at"] else 0
        if row is None or row["used_at"] is not None:
            if revoked:
                # RFC 6749 §4.1.2: a code presented twice may have been stolen; whoever spent it
                # first loses the token too. Cached credentials are dropped on every replica.
                logger.warning("authorization code of client %s presented again: %d token(s) revoked", client.client_id, revoked)
                await self.authenticator.forget_cached()
            return None
        return AuthorizationCode(
            code=authorization_code, scopes=list(row["scopes"]), expires_at=row["expires_at"].timestamp(),
            client_id=row["client_id"], code_challenge=row["code_challenge"], redirect_uri=AnyUrl(row["redirect_uri"]),
            redirect_uri_provided_explicitly=True, resource=row["resource"], subject=row["key_id"] or MASTER_SUBJECT,
        )

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode) -> OAuthToken:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        ttl: timedelta = self.settings.oauth_token_ttl
        key_id = None if authorization_code.subject == MASTER_SUBJECT else authorization_code.subject
        async with self.pool.acquire() as conn, conn.transaction():
            # Single use: the code is spent in the same transaction that stores the token.
            if not await oauth_repo.use_code(conn, authorization_code.code):
                raise TokenError("invalid_grant", "authorization code already used")
            await oauth_repo.create_token(
                conn, token=token, code=authorization_code.code, client_id=authorization_code.client_id, key_id=key_id,
                scopes=authorization_code.scopes, expires_at=datetime.now(UTC) + ttl,
            )
        return OAuthToken(access_token=token, token_type="Bearer", expires_in=int(ttl.total_seconds()))  # noqa: S106 - a scheme name

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return None  # seed: authorization_code is the only grant

    async def exchange_refresh_token(self, *args: Any) -> OAuthToken:
        raise TokenError("unsupported_grant_type", "refresh tokens are not issued")

    async def load_access_token(self, token: str) -> AccessToken | None:
        return None

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        raise NotImplementedError  # POST /register is ours (API-key binding)

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        raise NotImplementedError  # GET /authorize is ours (consent page)


def _error(status: int, error: str, description: str) -> JSONResponse:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)


async def authorization_server_metadata(request: Request) -> JSONResponse:
    base = base_url(request)
    return JSONResponse({
        "issuer": base,
        "authorization_endpoint": f"{base}/authorize",
        "token_endpoint": f"{base}/token",
        "registration_endpoint": f"{base}/register",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
    })


async def protected_resource_metadata(request: Request) -> JSONResponse:
    base = base_url(request)
    return JSONResponse({
        "resource": f"{base}/mcp",
        "authorization_servers": [base],
        "bearer_methods_supported": ["header"],
        "resource_name": "Engram",
    })


async def register(request: Request) -> JSONResponse:
    state = gateway_state(request)
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "invalid_client_metadata", "body must be JSON")
    if not isinstance(body, dict):
        return _error(400, "invalid_client_metadata", "body must be a JSON object")
    redirect_uris = body.get("redirect_uris")
    if not isinstance(redirect_uris, list) or not redirect_uris or not all(isinstance(u, str) for u in redirect_uris):
        return _error(400, "invalid_redirect_uri", "redirect_uris must be a non-empty list of URIs")
    if len(redirect_uris) > MAX_REDIRECT_URIS or any(len(u) > MAX_REDIRECT_URI_CHARS for u in redirect_uris):
        return _error(400, "invalid_redirect_uri", f"at most {MAX_REDIRECT_URIS} redirect URIs of {MAX_REDIRECT_URI_CHARS} characters")
    settings: GatewaySettings = state.settings
    refused = [u for u in redirect_uris if not redirect_allowed(u, settings.oauth_redirect_allowlist, settings.oauth_redirect_exact_uris)]
    if refused:
        return _error(400, "invalid_redirect_uri", f"redirect URI not allowed: {refused[0][:200]}")
    client_name = body.get("client_name")
    if client_name is not None and (
        not isinstance(client_name, str) or len(client_name) > MAX_CLIENT_NAME_CHARS or _CONTROL.search(client_name)
    ):
        return _error(400, "invalid_client_metadata", f"client_name must be a string of at most {MAX_CLIENT_NAME_CHARS} characters")
    metadata = {k: body[k] for k in KEPT_METADATA if k in body}
    serialized = json.dumps(metadata)
    if len(serialized) > MAX_METADATA_CHARS or "\\u0000" in serialized:  # jsonb refuses \u0000 too
        return _error(400, "invalid_client_metadata", f"client metadata must be under {MAX_METADATA_CHARS} characters, without NUL")
    key_id = None
    token = bearer_token(request.headers.get("authorization"))
    if token is not None:
        # An OAuth access token does not bind a client: only the key itself (or the master key) does.
        principal = None if token.startswith(TOKEN_PREFIX) else await state.authenticator.authenticate(token)
        if principal is None:
            return _error(401, "invalid_token", "the Bearer credential must be an API key or the master key")
        key_id = principal.key_id
    if key_id is not None:
        # seed: "<name>_<keyIdHex8>", URL-safe
        name = re.sub(r"[^A-Za-z0-9_-]+", "-", client_name or "client").strip("-") or "client"
        client_id = f"{name}_{key_id[:8]}"
    else:
        client_id = f"mmcp_{secrets.token_hex(12)}"
    async with state.pool.acquire() as conn:
        row = await oauth_repo.create_client(
            conn, client_id=client_id, client_name=client_name, redirect_uris=redirect_uris, key_id=key_id, metadata=metadata,
        )
    if row is None:
        # Another key whose id starts with the same eight hex digits registered this name first.
        return _error(400, "invalid_client_metadata", "this client_name is taken for another key; choose another")
    return JSONResponse(
        {
            "client_id": client_id,
            "client_name": client_name,
            "redirect_uris": redirect_uris,
            "grant_types": ["authorization_code"],
            "token_endpoint_auth_method": "none",
        },
        status_code=201,
    )


AUTH_FIELDS = ("response_type", "client_id", "redirect_uri", "code_challenge", "code_challenge_method", "state", "resource")


async def _validated(request: Request, params: dict[str, str]) -> RegisteredClient | Response:
    """The client, when the authorization request is well formed; else the error response (never
    a redirect: the redirect URI is not trusted yet)."""
    service: OAuthService = gateway_state(request).oauth
    client_id = params.get("client_id", "")
    client = await service.registered(client_id) if client_id else None
    if client is None:
        return _error(400, "invalid_client", "unknown client_id")
    # RFC 6749 §3.1.2.3 / Security BCP §4.1.3: exact string match against the registered URIs.
    if params.get("redirect_uri", "") not in client.redirect_uris:
        return _error(400, "invalid_request", "redirect_uri is not registered for this client")
    if params.get("response_type") != "code":
        return _error(400, "unsupported_response_type", "response_type must be code")
    if not _S256_CHALLENGE.fullmatch(params.get("code_challenge", "")):
        return _error(400, "invalid_request", "code_challenge is required (PKCE): the 43-character S256 challenge")
    if params.get("code_challenge_method") != "S256":
        return _error(400, "invalid_request", "code_challenge_method must be S256")
    resource = params.get("resource")
    if resource is not None and (len(resource) > MAX_RESOURCE_CHARS or _CONTROL.search(resource)):
        return _error(400, "invalid_request", f"resource must be a URI of at most {MAX_RESOURCE_CHARS} characters")
    return client


def _redirect(uri: str, query: dict[str, str]) -> RedirectResponse:
    separator = "&" if "?" in uri else "?"
    return RedirectResponse(f"{uri}{separator}{urlencode(query)}", status_code=302)


async def authorize_page(request: Request) -> Response:
    params = {k: v for k, v in request.query_params.items() if k in AUTH_FIELDS}
    checked = await _validated(request, params)
    if isinstance(checked, Response):
        return checked
    csrf = gateway_state(request).oauth.csrf
    return consent_page(request, client_id=checked.client_id, bound_key_id=checked.key_id, params=params, csrf=csrf)


async def authorize_decision(request: Request) -> Response:
    form = await request.form()
    params = {k: str(form[k]) for k in AUTH_FIELDS if k in form}
    checked = await _validated(request, params)
    if isinstance(checked, Response):
        return checked
    client = checked
    service: OAuthService = gateway_state(request).oauth
    redirect_uri = params["redirect_uri"]
    state_param = {"state": params["state"]} if params.get("state") else {}
    if form.get("decision") != "allow":
        return _redirect(redirect_uri, {"error": "access_denied", **state_param})

    def again(error: str, status: int, headers: dict[str, str] | None = None) -> Response:
        return consent_page(
            request, client_id=client.client_id, bound_key_id=client.key_id, params=params, csrf=service.csrf,
            error=error, status=status, headers=headers,
        )

    # Wrong keys are throttled per client IP with the gateway's limiter; the check comes first,
    # so past the limit even the right key waits (a throttled guesser learns nothing).
    limiter: RateLimiter = gateway_state(request).limiter
    limit = service.settings.oauth_consent_failures_per_min
    address = request.client.host if request.client else "unknown"
    throttled, retry = await limiter.exceeded("consent", address, limit)
    if throttled:
        return again(f"Too many wrong keys from this address; try again in {retry} s.", 429, {"Retry-After": str(retry)})
    try:
        service.csrf.check(str(form.get(CSRF_FIELD) or ""), request.cookies.get(cookie_name(request)), params)
        authenticator: Authenticator = gateway_state(request).authenticator
        key_id = await consenting_key(authenticator, str(form.get(KEY_FIELD) or ""), client.key_id)
    except ConsentRefused as refused:
        if refused.wrong_key:
            await limiter.hit("consent", address, limit)
        return again(refused.message, refused.status)
    code = await service.issue_code(client.client_id, key_id, redirect_uri, params["code_challenge"], params.get("resource"))
    return _redirect(redirect_uri, {"code": code, **state_param})


async def _token_redirect_differs(service: OAuthService, request: Request) -> Response | None:
    """RFC 6749 §4.1.3: the redirect_uri at /token must be identical to /authorize's. The SDK
    compares the two after URL normalisation (`/cb/../cb` equals `/cb`), so the strings first."""
    form = await request.form()  # cached on the request: the SDK's handler reads the same form
    code, client_id, redirect_uri = (form.get(k) for k in ("code", "client_id", "redirect_uri"))
    if not (isinstance(code, str) and isinstance(client_id, str) and isinstance(redirect_uri, str)):
        return None  # the SDK's own validation answers
    issued = await service.code_redirect_uri(code, client_id)
    if issued is None or issued == redirect_uri:
        return None
    return JSONResponse(
        {"error": "invalid_grant", "error_description": "redirect_uri differs from the one given at /authorize"},
        status_code=400, headers={"Cache-Control": "no-store"},
    )


def install_oauth(app: FastAPI) -> None:
    class _Token:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            service = state_of(scope).oauth
            request = Request(scope, receive)
            response = await _token_redirect_differs(service, request)
            if response is None:
                handler = TokenHandler(service, ClientAuthenticator(service))  # type: ignore[arg-type]
                response = await handler.handle(request)
            await response(scope, receive, send)

    app.add_api_route("/.well-known/oauth-authorization-server", authorization_server_metadata, methods=["GET"])
    app.add_api_route("/.well-known/oauth-protected-resource", protected_resource_metadata, methods=["GET"])
    app.add_api_route("/.well-known/oauth-protected-resource/mcp", protected_resource_metadata, methods=["GET"])
    app.add_api_route("/register", register, methods=["POST"])
    app.add_api_route("/authorize", authorize_page, methods=["GET"])
    app.add_api_route("/authorize", authorize_decision, methods=["POST"])
    app.router.routes.append(Route("/token", endpoint=_Token(), methods=["POST"]))
