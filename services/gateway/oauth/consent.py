"""The consent step of OAuth `/authorize`: who may allow a client, and the CSRF token that ties
the consent form to one authorization request and to the browser that opened it.

An authorization server issues a code only to an authenticated resource owner, through a form
protected against cross-site requests (RFC 6749 §10.12, OAuth 2.0 Security BCP). Engram has no
user accounts: the resource owner is whoever holds the key, so the consent page asks for it.

Who may consent:
- a client registered with an API key's Bearer (`<name>_<keyIdHex8>`): that key, or the master
  key. The code carries the client's key either way: the master key's holder (the operator, who
  can already read and change every key) consents *for* that key, and a key-bound client never
  becomes a master client. Any other key is refused, even an active one.
- a client registered without a Bearer or with the master key's (a random `mmcp_` id): any
  active API key, whose tenant the client then acts as, or the master key (a master token).
An OAuth access token is not a key here: a token must not mint tokens that outlive it.

The CSRF token is `<expiry>.<nonce>.<hmac>`, HMAC-SHA256 over the authorization request's
fields, the nonce and the expiry, keyed by a secret derived from the master key (so every
replica derives the same one). The nonce is also set on the page as a SameSite=Strict,
HttpOnly cookie and the POST must present both (double submit): a form posted from another site
carries no cookie, and a token an attacker fetched for itself names the attacker's nonce.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import re
import secrets
import time
from collections.abc import Mapping

from fastapi import Request
from fastapi.responses import HTMLResponse

from services.gateway.core.auth import OAUTH_TOKEN_PREFIX, Authenticator

CSRF_FIELD = "csrf_token"
KEY_FIELD = "access_key"
# Over HTTPS the cookie takes the `__Host-` prefix: Secure, Path=/, no Domain, so a sibling
# subdomain cannot plant a nonce of its choosing (cookie tossing).
CSRF_COOKIE = "engram_consent"
# A person reads the page and fetches the key; ten minutes is plenty, and bounds a leaked form.
CSRF_TTL_SECONDS = 600
# Longer than any key or master key in use; refused before it is hashed.
MAX_KEY_CHARS = 512
_SECRET_LABEL = b"engram/oauth-consent-csrf/v1"
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_TOKEN = re.compile(r"(\d{1,12})\.([A-Za-z0-9_-]{16,64})\.([0-9a-f]{64})")


class ConsentRefused(Exception):
    """No code. `status` is the HTTP status the page comes back with; `wrong_key` counts the
    attempt toward the consent throttle (a key was tried and was not the owner's)."""

    def __init__(self, status: int, message: str, *, wrong_key: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.wrong_key = wrong_key


class ConsentCsrf:
    def __init__(self, master_key: str) -> None:
        # Derived rather than the master key itself: this MAC key signs nothing else. Without a
        # master key (dev only), a per-process secret: a form then verifies on the replica that served it.
        seed = master_key.encode() if master_key else secrets.token_bytes(32)
        self._secret = hmac.new(seed, _SECRET_LABEL, hashlib.sha256).digest()

    def issue(self, nonce: str, request: Mapping[str, str]) -> str:
        expiry = int(time.time()) + CSRF_TTL_SECONDS
        return f"{expiry}.{nonce}.{self._mac(expiry, nonce, request)}"

    def check(self, token: str, cookie_nonce: str | None, request: Mapping[str, str]) -> None:
        """Pass only a token we signed, unexpired, for exactly this request, from this browser."""
        parts = _TOKEN.fullmatch(token)
        if parts is None:
            raise ConsentRefused(403, "The form's security token is missing. Open the consent page again.")
        expiry, nonce, mac = int(parts[1]), parts[2], parts[3]
        if not hmac.compare_digest(mac.encode(), self._mac(expiry, nonce, request).encode()):
            raise ConsentRefused(403, "The form's security token does not match this request. Open the consent page again.")
        if expiry < time.time():
            raise ConsentRefused(403, "The consent form has expired. Open the consent page again.")
        if not cookie_nonce or not hmac.compare_digest(nonce.encode(), cookie_nonce.encode()):
            raise ConsentRefused(403, "The form was not sent from the consent page this browser opened.")

    def _mac(self, expiry: int, nonce: str, request: Mapping[str, str]) -> str:
        message = json.dumps([expiry, nonce, sorted(request.items())], separators=(",", ":"))
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()


def _https(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def cookie_name(request: Request) -> str:
    return f"__Host-{CSRF_COOKIE}" if _https(request) else CSRF_COOKIE


def browser_nonce(request: Request) -> str:
    """This browser's consent nonce: the one its cookie holds (two consent tabs keep working), else new."""
    existing = request.cookies.get(cookie_name(request))
    return existing if existing and _NONCE.fullmatch(existing) else secrets.token_urlsafe(24)


async def consenting_key(authenticator: Authenticator, raw_key: str, bound_key_id: str | None) -> str | None:
    """The key id the code will carry (None: the master key's), or ConsentRefused."""
    if not raw_key:
        raise ConsentRefused(401, "Enter the API key this client is for, or the master key.")
    if raw_key.startswith(OAUTH_TOKEN_PREFIX) or len(raw_key) > MAX_KEY_CHARS:
        raise ConsentRefused(401, "That is not an API key or the master key.", wrong_key=True)
    principal = await authenticator.authenticate(raw_key)
    if principal is None:
        raise ConsentRefused(401, "That key is not valid or not active.", wrong_key=True)
    if bound_key_id is None:
        return principal.key_id
    if principal.is_master or principal.key_id == bound_key_id:
        return bound_key_id
    raise ConsentRefused(403, "This client was registered for another API key; enter that key.", wrong_key=True)


def consent_page(
    request: Request, *, client_id: str, bound_key_id: str | None, params: Mapping[str, str], csrf: ConsentCsrf,
    error: str | None = None, status: int = 200, headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    nonce = browser_nonce(request)
    fields = {**params, CSRF_FIELD: csrf.issue(nonce, params)}
    hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields.items())
    who = (
        f"<p>This client was registered for API key <code>{html.escape(bound_key_id[:8])}</code>. Enter that key "
        "(or the master key) to allow it; it will act as that key.</p>"
        if bound_key_id
        else "<p>Enter your API key; the client will act as that key (the master key gives it full access).</p>"
    )
    alert = f'<p role="alert"><strong>{html.escape(error)}</strong></p>' if error else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Authorize {html.escape(client_id)}</title></head>
<body><h1>Allow <code>{html.escape(client_id)}</code> to use your Engram memory?</h1>{alert}
<p>After you answer, your browser returns to <code>{html.escape(params.get("redirect_uri", ""))}</code>.</p>
<form method="post" action="/authorize">{hidden}{who}
<p><label>Key <input type="password" name="{KEY_FIELD}" autocomplete="off"></label></p>
<button type="submit" name="decision" value="allow">Allow</button>
<button type="submit" name="decision" value="deny">Deny</button></form></body></html>"""
    response = HTMLResponse(page, status_code=status, headers={
        "Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
        "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'", **(headers or {}),
    })
    https = _https(request)
    response.set_cookie(
        cookie_name(request), nonce, max_age=CSRF_TTL_SECONDS, path="/" if https else "/authorize",
        httponly=True, samesite="strict", secure=https,
    )
    return response
