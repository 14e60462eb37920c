"""OAuth 2.0 for MCP clients: RFC 8414 / RFC 9728 metadata, RFC 7591 registration (with API
key binding), a consent page with PKCE S256, and the token endpoint.

seed: `POST /register` with an API-key Bearer names the client `<name>_<keyIdHex8>` and the
key's tenant is restored at /authorize; without it the client id is random. `GET /authorize`
renders consent, `POST /authorize` takes decision=allow|deny. Redirect URIs must be on an
allow-list (localhost by default). The token exchange (code single-use and short-lived, PKCE
verifier, redirect URI match) runs through the SDK's TokenHandler over our provider.
"""

from __future__ import annotations

import html
import logging
import re
import secrets
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlencode, urlparse

import asyncpg
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.client_auth import ClientAuthenticator
from mcp.server.auth.provider import AccessToken, AuthorizationCode, AuthorizationParams, RefreshToken, TokenError
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl
from starlette.routing import Route

from services.gateway.auth import OAUTH_TOKEN_PREFIX as TOKEN_PREFIX
from services.gateway.auth import Authenticator, bearer_token
from shared.domain.principal import Principal
from shared.repositories import oauth as oauth_repo
from shared.settings import GatewaySettings

logger = logging.getLogger(__name__)

MASTER_SUBJECT = "master"


def base_url(request: Request) -> str:
    scheme = request.headers.get("x-forwarded-proto", request.url.scheme)
    return f"{scheme}://{request.headers.get('host', request.url.netloc)}"


def redirect_allowed(uri: str, allowlist: list[str]) -> bool:
    """Same scheme and host as an allow-list entry (and its port, when the entry names one)."""
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


class OAuthService:
    """Our OAuthAuthorizationServerProvider (the parts the SDK's token handler calls)."""

    def __init__(self, pool: asyncpg.Pool, settings: GatewaySettings) -> None:
        self.pool = pool
        self.settings = settings

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        async with self.pool.acquire() as conn:
            row = await oauth_repo.get_client(conn, client_id)
        if row is None:
            return None
        return OAuthClientInformationFull(
            client_id=row["client_id"], client_name=row["client_name"], redirect_uris=[AnyUrl(u) for u in row["redirect_uris"]],
            token_endpoint_auth_method="none", grant_types=["authorization_code"], response_types=["code"],
        )

    async def client_key(self, client_id: str) -> tuple[bool, str | None]:
        """(bound to an API key?, that key's id)."""
        async with self.pool.acquire() as conn:
            row = await oauth_repo.get_client(conn, client_id)
        return (row is not None and row["key_id"] is not None), (row["key_id"] if row else None)

    async def issue_code(self, client_id: str, key_id: str | None, redirect_uri: str, challenge: str, resource: str | None) -> str:
        code = secrets.token_urlsafe(32)
        async with self.pool.acquire() as conn:
            await oauth_repo.create_code(
                conn, code=code, client_id=client_id, key_id=key_id, redirect_uri=redirect_uri, code_challenge=challenge,
                scopes=[], resource=resource, expires_at=datetime.now(timezone.utc) + self.settings.oauth_code_ttl,
            )
        return code

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str) -> AuthorizationCode | None:
        async with self.pool.acquire() as conn:
            row = await oauth_repo.get_unused_code(conn, authorization_code, str(client.client_id))
        if row is None:
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
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                if not await oauth_repo.use_code(conn, authorization_code.code):
                    raise TokenError("invalid_grant", "authorization code already used")
                await oauth_repo.create_token(
                    conn, token=token, client_id=authorization_code.client_id, key_id=key_id,
                    scopes=authorization_code.scopes, expires_at=datetime.now(timezone.utc) + ttl,
                )
        return OAuthToken(access_token=token, token_type="Bearer", expires_in=int(ttl.total_seconds()))

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
    state = request.app.state
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "invalid_client_metadata", "body must be JSON")
    if not isinstance(body, dict):
        return _error(400, "invalid_client_metadata", "body must be a JSON object")
    redirect_uris = body.get("redirect_uris")
    if not isinstance(redirect_uris, list) or not redirect_uris or not all(isinstance(u, str) for u in redirect_uris):
        return _error(400, "invalid_redirect_uri", "redirect_uris must be a non-empty list of URIs")
    refused = [u for u in redirect_uris if not redirect_allowed(u, state.settings.oauth_redirect_allowlist)]
    if refused:
        return _error(400, "invalid_redirect_uri", f"redirect URI not allowed: {refused[0]}")
    client_name = body.get("client_name") if isinstance(body.get("client_name"), str) else None
    key_id = None
    token = bearer_token(request.headers.get("authorization"))
    if token is not None:
        principal = await state.authenticator.authenticate(token)
        if principal is None:
            return _error(401, "invalid_token", "the Bearer credential is not valid")
        key_id = principal.key_id
    if key_id is not None:
        # seed: "<name>_<keyIdHex8>", URL-safe
        name = re.sub(r"[^A-Za-z0-9_-]+", "-", client_name or "client").strip("-") or "client"
        client_id = f"{name}_{key_id[:8]}"
    else:
        client_id = f"mmcp_{secrets.token_hex(12)}"
    async with state.pool.acquire() as conn:
        await oauth_repo.create_client(
            conn, client_id=client_id, client_name=client_name, redirect_uris=redirect_uris, key_id=key_id,
            metadata={k: v for k, v in body.items() if k not in ("redirect_uris", "client_name")},
        )
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


async def _validated(request: Request, params: dict[str, str]) -> tuple[str, str | None] | Response:
    """(client_id, bound key id) or the error response."""
    service: OAuthService = request.app.state.oauth
    client_id = params.get("client_id", "")
    client = await service.get_client(client_id) if client_id else None
    if client is None:
        return _error(400, "invalid_client", "unknown client_id")
    redirect_uri = params.get("redirect_uri", "")
    if redirect_uri not in [str(u) for u in client.redirect_uris or []] and redirect_uri not in [
        str(u).rstrip("/") for u in client.redirect_uris or []
    ]:
        return _error(400, "invalid_request", "redirect_uri is not registered for this client")
    if params.get("response_type") != "code":
        return _error(400, "unsupported_response_type", "response_type must be code")
    if not params.get("code_challenge"):
        return _error(400, "invalid_request", "code_challenge is required (PKCE)")
    if params.get("code_challenge_method") != "S256":
        return _error(400, "invalid_request", "code_challenge_method must be S256")
    bound, key_id = await service.client_key(client_id)
    return client_id, key_id if bound else None


def _redirect(uri: str, query: dict[str, str]) -> RedirectResponse:
    separator = "&" if "?" in uri else "?"
    return RedirectResponse(f"{uri}{separator}{urlencode(query)}", status_code=302)


async def authorize_page(request: Request) -> Response:
    params = {k: v for k, v in request.query_params.items() if k in AUTH_FIELDS}
    checked = await _validated(request, params)
    if isinstance(checked, Response):
        return checked
    client_id, key_id = checked
    hidden = "".join(f'<input type="hidden" name="{k}" value="{html.escape(v)}">' for k, v in params.items())
    who = (
        f"<p>This client is bound to API key <code>{html.escape(key_id[:8])}</code>; it will act as that key.</p>"
        if key_id
        else '<p><label>Access key <input type="password" name="access_key" autocomplete="off"></label></p>'
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Authorize {html.escape(client_id)}</title></head>
<body><h1>Allow <code>{html.escape(client_id)}</code> to use your Engram memory?</h1>
<form method="post" action="/authorize">{hidden}{who}
<button type="submit" name="decision" value="allow">Allow</button>
<button type="submit" name="decision" value="deny">Deny</button></form></body></html>"""
    return HTMLResponse(page, headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"})


async def authorize_decision(request: Request) -> Response:
    form = await request.form()
    params = {k: str(form[k]) for k in AUTH_FIELDS if k in form}
    checked = await _validated(request, params)
    if isinstance(checked, Response):
        return checked
    client_id, key_id = checked
    redirect_uri = params["redirect_uri"]
    state_param = {"state": params["state"]} if params.get("state") else {}
    if form.get("decision") != "allow":
        return _redirect(redirect_uri, {"error": "access_denied", **state_param})
    if key_id is None:
        # Not bound to a key: whoever consents names the tenant with their own key.
        authenticator: Authenticator = request.app.state.authenticator
        principal: Principal | None = await authenticator.authenticate(str(form.get("access_key") or "") or None)
        if principal is None:
            return _error(401, "access_denied", "a valid access key is required to consent")
        key_id = principal.key_id
        subject_key = key_id
    else:
        subject_key = key_id
    code = await request.app.state.oauth.issue_code(client_id, subject_key, redirect_uri, params["code_challenge"], params.get("resource"))
    return _redirect(redirect_uri, {"code": code, **state_param})


def install_oauth(app: FastAPI) -> None:
    class _Token:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            service = app.state.oauth
            handler = TokenHandler(service, ClientAuthenticator(service))  # type: ignore[arg-type]
            response = await handler.handle(Request(scope, receive))
            await response(scope, receive, send)

    app.add_api_route("/.well-known/oauth-authorization-server", authorization_server_metadata, methods=["GET"])
    app.add_api_route("/.well-known/oauth-protected-resource", protected_resource_metadata, methods=["GET"])
    app.add_api_route("/.well-known/oauth-protected-resource/mcp", protected_resource_metadata, methods=["GET"])
    app.add_api_route("/register", register, methods=["POST"])
    app.add_api_route("/authorize", authorize_page, methods=["GET"])
    app.add_api_route("/authorize", authorize_decision, methods=["POST"])
    app.router.routes.append(Route("/token", endpoint=_Token(), methods=["POST"]))
