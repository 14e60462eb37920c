"""/api/openapi.json and /api/docs: the mnemory REST surface's OpenAPI document and Swagger UI,
public metadata (reference 004) while every operation they describe needs a credential.
Swagger UI's assets come from the swagger-ui-bundle wheel: no CDN, nothing fetched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import swagger_ui_bundle
from fastapi import APIRouter, HTTPException
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.routing import BaseRoute

ASSETS = Path(swagger_ui_bundle.swagger_ui_path)
_SERVED = frozenset({"swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "favicon-32x32.png", "favicon-16x16.png"})
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Engram: mnemory REST API</title>
<link rel="stylesheet" href="/api/docs/swagger-ui.css"><link rel="icon" href="/api/docs/favicon-32x32.png"></head>
<body><div id="swagger-ui"></div>
<script src="/api/docs/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "/api/openapi.json", dom_id: "#swagger-ui", deepLinking: true});</script>
</body></html>"""


def build_router(routes: list[BaseRoute], version: str) -> APIRouter:
    router = APIRouter(prefix="/api", include_in_schema=False)
    document: dict[str, Any] = {}

    @router.get("/openapi.json")
    async def openapi_json() -> JSONResponse:
        if not document:
            document.update(get_openapi(
                title="Engram: mnemory REST API (reference 004)", version=version, routes=routes,
                description="Authenticate with an Engram API key (Authorization: Bearer or X-API-Key) or an ES256 "
                            "JWT with aud=mnemory. X-Agent-Id scopes a call to one agent.",
            ))
            document.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An Engram API key or an ES256 JWT (aud=mnemory)"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            }
            document["security"] = [{"bearer": []}, {"apiKey": []}]
        return JSONResponse(document)

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        return HTMLResponse(_PAGE)

    @router.get("/docs/{asset}")
    async def swagger_asset(asset: str) -> FileResponse:
        if asset not in _SERVED:
            raise HTTPException(status_code=404, detail="Not Found")
        return FileResponse(ASSETS / asset)

    return router
