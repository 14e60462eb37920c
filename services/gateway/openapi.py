"""GET /openapi.json (seed: OpenAPI 3.1.0, ENABLE_OPENAPI=true else 404, authentication
required; the master key sees every path including the admin REST API, an API key sees only
the tools its permissions allow)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from services.gateway.core.caller import has_permission
from services.gateway.core.scope import PRINCIPAL_SCOPE_KEY
from services.gateway.core.state import gateway_state
from services.gateway.core.wire import unauthorized
from shared.contract.catalog import TOOLS
from shared.domain.principal import Principal

ADMIN_PREFIX = "/v1/internal/model/nothing"
JSONRPC_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"type": "object", "required": ["jsonrpc", "method"], "properties": {
        "jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer"]}, "method": {"type": "string"}, "params": {"type": "object"},
    }}}},
}


def _transport_paths() -> dict[str, Any]:
    ok = {"200": {"description": "JSON-RPC response (JSON or an SSE stream)"}, "401": {"description": "Unauthorized"}}
    # services/gateway/core/jsonrpc_guard.py
    malformed = {"400": {"description": "Not one valid JSON-RPC message: -32700 (bad JSON) or -32600, id null"}}
    return {
        "/mcp": {
            "post": {"summary": "Streamable HTTP: JSON-RPC request", "requestBody": JSONRPC_BODY, "responses": {**ok, **malformed},
                     "parameters": [{"name": "Mcp-Session-Id", "in": "header", "required": False, "schema": {"type": "string"}},
                                    {"name": "X-Memento-Mode", "in": "header", "required": False,
                                     "schema": {"enum": ["recall-only", "write-only", "onboarding", "audit"]}}]},
            "get": {"summary": "Streamable HTTP: server push stream", "responses": ok},
            "delete": {"summary": "Streamable HTTP: end the session", "responses": ok},
        },
        "/token": {"post": {"summary": "OAuth 2.0 token endpoint (authorization_code + PKCE verifier)",
                            "requestBody": {"content": {"application/x-www-form-urlencoded": {"schema": {"type": "object"}}}},
                            "responses": {"200": {"description": "Access token"}, "400": {"description": "OAuth error"}}}},
        "/sse": {"get": {"summary": "Legacy SSE: open a session", "responses": ok,
                         "parameters": [{"name": "accessKey", "in": "query", "required": True, "schema": {"type": "string"}}]}},
        "/message": {"post": {"summary": "Legacy SSE: JSON-RPC request; the reply arrives on the stream", "requestBody": JSONRPC_BODY,
                              "responses": {"202": {"description": "Accepted"}, **malformed},
                              "parameters": [{"name": "sessionId", "in": "query", "required": True, "schema": {"type": "string"}}]}},
    }


def document(app: FastAPI, principal: Principal) -> dict[str, Any]:
    spec = get_openapi(title="Engram", version=app.version, openapi_version="3.1.0", routes=app.routes)
    paths: dict[str, Any] = {**_transport_paths(), **spec.get("paths", {})}
    if not principal.is_master:
        paths = {p: v for p, v in paths.items() if not p.startswith(ADMIN_PREFIX)}
    spec["paths"] = dict(sorted(paths.items()))
    tools = [t for t in TOOLS if has_permission(principal, t.permission)]
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for tool in tools:
        schemas[f"{tool.name}_arguments"] = tool.input_schema()
    # MCP tools are JSON-RPC `tools/call` on /mcp, not HTTP paths; they are listed here.
    spec["x-mcp-tools"] = [
        {"name": t.name, "description": t.description, "permission": t.permission, "meta": t.meta(),
         "arguments": {"$ref": f"#/components/schemas/{t.name}_arguments"}}
        for t in tools
    ]
    spec["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer"},
        # The /api/ REST surfaces (references 001, 004) take the key in X-API-Key too.
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    }
    spec["security"] = [{"bearer": []}, {"apiKey": []}]
    return spec


def install(app: FastAPI) -> None:
    async def openapi_json(request: Request) -> JSONResponse:
        if not gateway_state(request).settings.enable_openapi:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
        if principal is None:
            return unauthorized(request.scope)
        return JSONResponse(document(request.app, principal))

    app.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
