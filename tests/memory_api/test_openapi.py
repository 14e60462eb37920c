"""/openapi.json documents the memory REST API (issue 19 item 7): every route, its scope's
credentials, and the request shapes with their required fields."""

from __future__ import annotations

import httpx

from tests.memory_api.conftest import API

ROUTES = {
    "/namespaces": {"get", "post"},
    "/namespaces/{id}": {"get", "put", "delete"},
    "/namespaces/{id}/toggle": {"patch"},
    "/namespaces/{ns_id}/entries": {"get", "post", "delete"},
    "/namespaces/{ns_id}/entries/{id}": {"get", "put", "delete"},
    "/namespaces/{ns_id}/entries/bulk-delete": {"post"},
    "/namespaces/{ns_id}/entries/move": {"post"},
    "/namespaces/{ns_id}/export": {"post"},
    "/namespaces/{ns_id}/consolidate": {"post"},
    "/entries": {"get"},
    "/entries/enabled": {"get"},
    "/stats": {"get"},
    "/context": {"get"},
    "/export": {"get"},
    "/import": {"post"},
    "/extract": {"post"},
    "/ensure-model-available": {"post"},
    "/consolidation/run": {"post"},
    "/consolidation/status": {"get"},
}


async def test_openapi_documents_the_memory_routes(stack, llm_gateway: str) -> None:
    async with httpx.AsyncClient(base_url=llm_gateway, headers={"Authorization": f"Bearer {stack.master_key}"}) as http:
        spec = (await http.get("/openapi.json")).json()
    paths = spec["paths"]
    for path, methods in ROUTES.items():
        assert set(paths[API + path]) >= methods, path
    assert sum(len(m) for m in ROUTES.values()) == 26  # the reference's request/response endpoints
    assert {"bearer", "apiKey"} <= set(spec["components"]["securitySchemes"])
    assert spec["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    schemas = spec["components"]["schemas"]
    assert set(schemas["CreateEntryRequest"]["required"]) == {"content", "source"}
    assert schemas["CreateEntryRequest"]["properties"]["source"]["enum"] == ["auto", "manual"]
    assert set(schemas["CreateNamespaceRequest"]["required"]) == {"name", "description"}
    assert schemas["ToggleNamespaceRequest"]["required"] == ["enabled"]
    listing = paths[f"{API}/namespaces/{{ns_id}}/entries"]["get"]
    params = {p["name"]: p for p in listing["parameters"]}
    assert {"tag", "q", "sort", "order", "limit", "offset"} <= set(params)
    importing = paths[f"{API}/import"]["post"]
    assert importing["requestBody"]["content"]["application/json"]["schema"]["required"] == ["data"]
    assert "413" in importing["responses"]
    assert {p["name"] for p in importing["parameters"]} == {"onConflict"}
    assert "Memory" in paths[f"{API}/stats"]["get"]["tags"]
