"""Namespaces (reference 001): CRUD, toggle sets and never flips, partial PUT, required
description, byte limits, 400 vs 422 vs 404, credentials and scopes."""

from __future__ import annotations

import uuid

import httpx

from tests.memory_api.conftest import API, Tenant, client
from tests.support import create_api_key


async def test_create_read_update_delete(tenant: Tenant) -> None:
    created = await tenant.namespace("Coding style", "Conventions for this codebase")
    assert set(created) == {"id", "name", "description", "enabled", "createdAt", "updatedAt"}
    assert uuid.UUID(created["id"]) and created["enabled"] is True and created["createdAt"].endswith("Z")
    ns = created["id"]
    assert (await tenant.client.get(f"{API}/namespaces/{ns}")).json() == created
    assert created in (await tenant.client.get(f"{API}/namespaces")).json()

    # PUT leaves out what it does not send.
    reply = await tenant.client.put(f"{API}/namespaces/{ns}", json={"description": "Only this changes"})
    assert reply.status_code == 200
    assert reply.json()["name"] == "Coding style" and reply.json()["description"] == "Only this changes"
    assert reply.json()["enabled"] is True and reply.json()["updatedAt"] >= created["updatedAt"]

    await tenant.entry(ns, "Prefer pnpm over npm in this repository.")
    assert (await tenant.client.delete(f"{API}/namespaces/{ns}")).status_code == 204
    assert (await tenant.client.get(f"{API}/namespaces/{ns}")).status_code == 404
    assert (await tenant.client.get(f"{API}/namespaces/{ns}/entries")).status_code == 404
    assert (await tenant.client.delete(f"{API}/namespaces/{ns}")).status_code == 404


async def test_toggle_sets_the_value_it_is_given(tenant: Tenant) -> None:
    ns = (await tenant.namespace())["id"]
    for _ in range(2):  # idempotent: the same value twice stays put
        reply = await tenant.client.patch(f"{API}/namespaces/{ns}/toggle", json={"enabled": False})
        assert reply.status_code == 200 and reply.json()["enabled"] is False
    reply = await tenant.client.patch(f"{API}/namespaces/{ns}/toggle", json={"enabled": True})
    assert reply.json()["enabled"] is True
    # {} lacks the required field: 422; a 0-byte body does not parse at all: 400.
    assert (await tenant.client.patch(f"{API}/namespaces/{ns}/toggle", json={})).status_code == 422
    empty = await tenant.client.patch(f"{API}/namespaces/{ns}/toggle", content=b"", headers={"content-type": "application/json"})
    assert empty.status_code == 400
    assert (await tenant.client.patch(f"{API}/namespaces/{ns}/toggle", json={"enabled": "false"})).status_code == 422
    assert (await tenant.client.get(f"{API}/namespaces/{ns}")).json()["enabled"] is True
    missing = await tenant.client.patch(f"{API}/namespaces/{uuid.uuid4()}/toggle", json={"enabled": True})
    assert missing.status_code == 404


async def test_create_refusals(tenant: Tenant) -> None:
    post = tenant.client.post
    assert (await post(f"{API}/namespaces", json={"name": "no description"})).status_code == 422
    assert (await post(f"{API}/namespaces", json={"name": 5, "description": ""})).status_code == 422
    assert (await post(f"{API}/namespaces", content=b"{not json", headers={"content-type": "application/json"})).status_code == 400
    assert (await post(f"{API}/namespaces", json={"name": "x" * 201, "description": ""})).status_code == 400
    assert (await post(f"{API}/namespaces", json={"name": "é" * 101, "description": ""})).status_code == 400  # 202 bytes
    assert (await post(f"{API}/namespaces", json={"name": "ok", "description": "d" * 2001})).status_code == 400
    assert (await post(f"{API}/namespaces", json={"name": "x" * 200, "description": "d" * 2000})).status_code == 201
    # The empty description is "no description", not a missing one.
    assert (await post(f"{API}/namespaces", json={"name": "blank", "description": ""})).status_code == 201
    assert (await tenant.client.get(f"{API}/namespaces/not-a-uuid")).status_code == 400


async def test_credentials_and_scopes(stack, tenant: Tenant) -> None:
    ns = (await tenant.namespace())["id"]
    async with client(stack.gateway_url, None) as anonymous:
        assert (await anonymous.get(f"{API}/namespaces")).status_code == 401
        assert (await anonymous.post(f"{API}/namespaces", json={"name": "n", "description": ""})).status_code == 401
    async with client(stack.gateway_url, "mmcp_not-a-key") as wrong:
        assert (await wrong.get(f"{API}/namespaces")).status_code == 401
    async with client(stack.gateway_url, tenant.key, bearer=True) as bearer:
        assert (await bearer.get(f"{API}/namespaces/{ns}")).status_code == 200

    reader_key, _ = await create_api_key(stack.database_url, permissions=["read"])
    async with client(stack.gateway_url, reader_key) as reader:
        assert (await reader.get(f"{API}/namespaces")).status_code == 200
        assert (await reader.post(f"{API}/namespaces", json={"name": "n", "description": ""})).status_code == 403
        reader_ns = (await reader.get(f"{API}/namespaces")).json()
        assert reader_ns == []
    writer_key, _ = await create_api_key(stack.database_url, permissions=["write"])
    async with client(stack.gateway_url, writer_key) as writer:
        made = await writer.post(f"{API}/namespaces", json={"name": "w", "description": ""})
        assert made.status_code == 201
        # memory_read: every GET, and the namespace export POST (it stores nothing).
        assert (await writer.get(f"{API}/namespaces")).status_code == 403
        assert (await writer.post(f"{API}/namespaces/{made.json()['id']}/export")).status_code == 403
        assert (await writer.delete(f"{API}/namespaces/{made.json()['id']}")).status_code == 204


async def test_plain_http_client_sees_json_errors(stack) -> None:
    async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
        reply = await http.get(f"{API}/stats")
    assert reply.status_code == 401 and reply.json()["error"] == "Unauthorized"
