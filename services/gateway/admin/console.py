"""The admin console (seed: GET /v1/internal/model/nothing serves the app shell with no auth;
/assets/* its static files, admin.css and admin.js, no auth; the data API behind it takes the
master key).

The shell and its assets hold no data: everything the console shows comes from the admin REST
routes, called by the browser with the master key the operator typed, which the console keeps
in sessionStorage only (gone with the tab). Plain ES modules and CSS from
services/gateway/admin/console/, no build step and no CDN. The shell carries a strict
Content-Security-Policy (scripts and styles from this origin only, no inline script, no
eval, no frames, no form posts elsewhere), so even a rendering bug that put a stored
fragment's markup into the page could not run it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

PREFIX = "/v1/internal/model/nothing"
STATIC_DIR = Path(__file__).resolve().parent / "console"
SHELL = "index.html"

MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The shell names no key and no data; it is re-fetched so a new deployment's assets load.
    "Cache-Control": "no-cache",
}

router = APIRouter(prefix=PREFIX)


@cache
def _assets() -> dict[str, Path]:
    """Every servable file, by its path under /assets/: a request names one of these or is a
    404, so no path a client sends ever reaches the filesystem (no ../, no symlink out)."""
    return {
        path.relative_to(STATIC_DIR).as_posix(): path
        for path in sorted(STATIC_DIR.rglob("*"))
        if path.is_file() and path.suffix in MEDIA_TYPES and not path.is_symlink()
    }


@router.get("", include_in_schema=False)
async def shell() -> HTMLResponse:
    return HTMLResponse((STATIC_DIR / SHELL).read_text(encoding="utf-8"), headers=SECURITY_HEADERS)


@router.get("/", include_in_schema=False)
async def shell_slash() -> RedirectResponse:
    # One URL for the shell: its asset and API paths are absolute, but a bookmark stays canonical.
    return RedirectResponse(PREFIX, status_code=308)


@router.get("/assets/{name:path}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    path = _assets().get(name)
    if path is None:
        raise HTTPException(status_code=404, detail="no such asset")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=SECURITY_HEADERS)
