"""Two tenants on every read route of today's surfaces, and another tenant's ids in paths and
bodies: each answers exactly as a missing object does (same status, same body once the id
itself is taken out), so no route is an oracle for what another tenant holds."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from services.stack.supervisor import Stack
from tests.security.conftest import MEMORY, http
from tests.support import create_api_key, unique


def shape(reply: httpx.Response, *ids: str) -> tuple[int, str]:
    text = reply.text
    for value in ids:
        text = text.replace(value, "<id>")
    return reply.status_code, text


async def same_as_missing(client: httpx.AsyncClient, method: str, template: str, theirs: dict[str, str],
                          missing: dict[str, str], body: Any = None, **kwargs: Any) -> tuple[int, str]:
    """The answer to `template` filled with another tenant's ids equals its answer filled with
    ids nobody holds (ids taken out of the bodies); returns that answer."""
    fill = (lambda v: (json_fill(body, v), template.format(**v)))

    def json_fill(value: Any, ids: dict[str, str]) -> Any:
        if isinstance(value, str):
            return value.format(**ids)
        if isinstance(value, list):
            return [json_fill(v, ids) for v in value]
        if isinstance(value, dict):
            return {k: json_fill(v, ids) for k, v in value.items()}
        return value

    answers = []
    for ids in (theirs, missing):
        content, path = fill(ids)
        reply = await client.request(method, path, json=content, **kwargs) if body is not None else \
            await client.request(method, path, **kwargs)
        answers.append(shape(reply, *ids.values()))
    assert answers[0] == answers[1], (method, template, answers)
    assert answers[0][0] in (200, 400, 404, 422), answers[0]
    return answers[0]


async def test_memory_api_other_tenants_ids_answer_as_missing(stack: Stack) -> None:
    a, _ = await create_api_key(stack.database_url)
    b, _ = await create_api_key(stack.database_url)
    marker = unique("zebra-quokka")
    async with http(stack, {"X-API-Key": a}) as client:
        ns = (await client.post(f"{MEMORY}/namespaces", json={"name": unique("a"), "description": marker})).json()["id"]
        entry = await client.post(f"{MEMORY}/namespaces/{ns}/entries", json={"content": f"A's note {marker}", "source": "manual"})
        assert entry.status_code == 201, entry.text
    theirs = {"ns": ns, "entry": entry.json()["id"]}
    missing = {"ns": str(uuid.uuid4()), "entry": "frag-" + uuid.uuid4().hex[:16]}
    async with http(stack, {"Authorization": f"Bearer {b}"}) as client:
        own = (await client.post(f"{MEMORY}/namespaces", json={"name": unique("b"), "description": ""})).json()["id"]
        for method, template, body in [
            ("GET", f"{MEMORY}/namespaces/{{ns}}", None),
            ("GET", f"{MEMORY}/namespaces/{{ns}}/entries", None),
            ("GET", f"{MEMORY}/namespaces/{{ns}}/entries/{{entry}}", None),
            ("POST", f"{MEMORY}/namespaces/{{ns}}/export", None),
            ("PUT", f"{MEMORY}/namespaces/{{ns}}", {"name": "taken"}),
            ("PATCH", f"{MEMORY}/namespaces/{{ns}}/toggle", {"enabled": False}),
            ("POST", f"{MEMORY}/namespaces/{{ns}}/entries", {"content": "planted", "source": "manual"}),
            ("PUT", f"{MEMORY}/namespaces/{{ns}}/entries/{{entry}}", {"content": "changed"}),
            ("DELETE", f"{MEMORY}/namespaces/{{ns}}/entries/{{entry}}", None),
            ("POST", f"{MEMORY}/namespaces/{{ns}}/entries/bulk-delete", {"ids": ["{entry}"]}),
            ("POST", f"{MEMORY}/namespaces/{{ns}}/entries/move", {"ids": ["{entry}"], "targetNamespaceId": own}),
            ("POST", f"{MEMORY}/namespaces/{own}/entries/move", {"ids": ["{entry}"], "targetNamespaceId": "{ns}"}),
            ("POST", f"{MEMORY}/namespaces/{own}/entries/bulk-delete", {"ids": ["{entry}"]}),
            ("POST", f"{MEMORY}/namespaces/{{ns}}/consolidate", {}),
            ("DELETE", f"{MEMORY}/namespaces/{{ns}}/entries", None),
            ("DELETE", f"{MEMORY}/namespaces/{{ns}}", None),
        ]:
            await same_as_missing(client, method, template, theirs, missing, body)
        await same_as_missing(client, "GET", f"{MEMORY}/entries?q={marker}&namespace={{ns}}", theirs, missing)
        # Reads over the whole store show none of A's.
        for path in ("/namespaces", f"/entries?q={marker}", "/entries/enabled", "/context", "/export", "/stats"):
            reply = await client.get(f"{MEMORY}{path}")
            assert reply.status_code == 200, (path, reply.text)
            assert marker not in reply.text and ns not in reply.text and theirs["entry"] not in reply.text, path
    # A still has everything B aimed at.
    async with http(stack, {"X-API-Key": a}) as client:
        kept = await client.get(f"{MEMORY}/namespaces/{ns}/entries/{theirs['entry']}")
    assert kept.status_code == 200 and kept.json()["content"] == f"A's note {marker}"


async def test_mnemory_other_tenants_ids_answer_as_missing(stack: Stack) -> None:
    a, _ = await create_api_key(stack.database_url)
    b, _ = await create_api_key(stack.database_url)
    marker = unique("okapi-narwhal")
    async with http(stack, {"X-API-Key": a}) as client:
        added = await client.post("/api/memories", json={"content": f"A's memory {marker}", "categories": [f"project:{marker}"]})
        memory = added.json()["results"][0]["id"]
        art = await client.post(f"/api/memories/{memory}/artifacts", json={"content": f"A's artifact {marker}", "filename": "a.txt"})
        assert art.status_code == 200, art.text
        check = await client.post("/api/fsck", json={})
        assert check.status_code == 200, check.text
        recalled = await client.post("/api/recall", json={"query": marker})
        assert recalled.status_code == 200, recalled.text
    theirs = {"m": memory, "a": art.json()["id"], "c": check.json()["check_id"], "s": recalled.json()["session_id"]}
    missing = {"m": "frag-" + uuid.uuid4().hex[:16], "a": str(uuid.uuid4()), "c": "987654321", "s": str(uuid.uuid4())}
    async with http(stack, {"X-API-Key": b}) as client:
        for method, template, body in [
            ("GET", "/api/memories/{m}/artifacts", None),
            ("GET", "/api/memories/{m}/artifacts/{a}", None),
            ("GET", "/api/memories/{m}/artifacts/{a}/raw", None),
            ("POST", "/api/memories/{m}/artifacts/{a}/download-token", {}),
            ("POST", "/api/memories/{m}/artifacts", {"content": "planted", "filename": "p.txt"}),
            ("DELETE", "/api/memories/{m}/artifacts/{a}", None),
            ("PUT", "/api/memories/{m}", {"content": "changed"}),
            ("DELETE", "/api/memories/{m}", None),
            ("POST", "/api/memories/by-ids", {"ids": ["{m}"]}),
            ("GET", "/api/fsck/{c}", None),
            ("POST", "/api/fsck/{c}/apply", {}),
            ("GET", "/api/sessions/{s}", None),
            ("DELETE", "/api/sessions/{s}", None),
            ("POST", "/api/sessions/{s}/consolidate", None),
        ]:
            await same_as_missing(client, method, template, theirs, missing, body)
        for method, path, body in [
            ("GET", "/api/memories", None), ("GET", "/api/categories", None), ("GET", "/api/memories/core", None),
            ("GET", "/api/memories/recent", None), ("GET", "/api/sessions", None),
            ("POST", "/api/memories/search", {"query": marker}), ("POST", "/api/memories/find", {"question": marker}),
        ]:
            reply = await client.request(method, path, json=body) if body is not None else await client.request(method, path)
            assert reply.status_code == 200, (path, reply.text)
            assert marker not in reply.text and memory not in reply.text, path
        # A's recall session id in B's hands is a session of B's (nothing of A's comes back).
        reused = await client.post("/api/recall", json={"session_id": theirs["s"], "query": marker})
        assert reused.status_code == 200 and marker not in reused.text, reused.text
    async with http(stack, {"X-API-Key": a}) as client:
        kept = await client.get(f"/api/memories/{memory}/artifacts/{theirs['a']}")
    assert kept.status_code == 200 and marker in kept.text
