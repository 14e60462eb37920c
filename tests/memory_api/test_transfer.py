"""Export and import (reference 001): both document shapes, `data` as a string (object: 422,
not JSON: 400), onConflict merge / skip and its spelling, refused agent-experience banks,
secrets screened, the 50 MiB limit, and a lossless 10,000-entry round trip."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg
import httpx

from tests.memory_api.conftest import API, Tenant
from tests.support import unique

MARKER = "[agent-experience]"


def _body(document: Any) -> dict[str, str]:
    return {"data": json.dumps(document)}


def _normalised(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries without their ids, timestamps as instants (the export writes 00:00:00Z for
    the document's 00:00:00.000000Z)."""
    return [{**e, "createdAt": _instant(e["createdAt"]), "updatedAt": _instant(e["updatedAt"])} for e in _without_ids(entries)]


def _instant(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _without_ids(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("id", "namespaceId")} for e in entries]


async def test_single_namespace_export_and_import(tenant: Tenant) -> None:
    ns = await tenant.namespace(unique("Coding style"), "Conventions")
    await tenant.entry(ns["id"], "Prefer pnpm over npm in this repository.", tags=["tooling"], metadata={"why": "speed"})
    await tenant.entry(ns["id"], "Generated summary of the build.", "auto")
    document = (await tenant.client.post(f"{API}/namespaces/{ns['id']}/export")).json()
    current = (await tenant.client.get(f"{API}/namespaces/{ns['id']}")).json()
    assert set(document) == {"namespace", "entries"} and document["namespace"] == current and len(document["entries"]) == 2

    reply = await tenant.client.post(f"{API}/import", json=_body(document))
    assert reply.status_code == 200
    created = reply.json()
    assert "created" not in created and created["name"] == ns["name"] and created["id"] != ns["id"]
    copied = (await tenant.client.get(f"{API}/namespaces/{created['id']}/entries")).json()
    assert _without_ids(copied) == _without_ids(document["entries"])
    assert not {e["id"] for e in copied} & {e["id"] for e in document["entries"]}  # new ids
    # The single shape always creates: onConflict does nothing there.
    again = (await tenant.client.post(f"{API}/import", params={"onConflict": "skip"}, json=_body(document))).json()
    assert again["id"] not in (ns["id"], created["id"])


async def test_full_store_merge_skip_and_refusals(tenant: Tenant) -> None:
    base = unique("bank")
    document = {"version": 1, "exportedAt": "2026-01-01T00:00:00Z", "namespaces": [
        {"namespace": {"id": "x", "name": f"{base}-a", "description": "", "enabled": True,
                       "createdAt": "2025-01-01T00:00:00Z", "updatedAt": "2025-01-02T00:00:00Z"},
         "entries": [{"id": "e1", "namespaceId": "x", "content": "Alpha fact one.", "source": "manual", "tags": ["a"],
                      "metadata": {"n": 1}, "createdAt": "2025-01-01T00:00:00Z", "updatedAt": "2025-01-02T00:00:00Z"}]},
        {"namespace": {"id": "y", "name": f"{base}-agent", "description": f"{MARKER} agent-1", "enabled": True,
                       "createdAt": "2025-01-01T00:00:00Z", "updatedAt": "2025-01-01T00:00:00Z"},
         "entries": [{"content": "Never stored.", "source": "auto", "tags": [], "metadata": {}}]},
    ]}
    first = (await tenant.client.post(f"{API}/import", json=_body(document))).json()
    assert first == {"created": [f"{base}-a"], "merged": [], "skipped": [], "refused": [f"{base}-agent"], "entriesImported": 1}
    names = {n["name"]: n for n in (await tenant.client.get(f"{API}/namespaces")).json()}
    assert f"{base}-agent" not in names
    bank = names[f"{base}-a"]
    assert bank["createdAt"] == "2025-01-01T00:00:00Z"
    [entry] = (await tenant.client.get(f"{API}/namespaces/{bank['id']}/entries")).json()
    assert entry["createdAt"] == "2025-01-01T00:00:00Z" and entry["updatedAt"] == "2025-01-02T00:00:00Z"
    assert entry["metadata"] == {"n": 1} and entry["tags"] == ["a"] and entry["source"] == "manual"

    # merge (the default) appends: a second import doubles the entries, it does not overwrite.
    second = (await tenant.client.post(f"{API}/import", json=_body(document))).json()
    assert second["merged"] == [f"{base}-a"] and second["created"] == [] and second["entriesImported"] == 1
    assert len((await tenant.client.get(f"{API}/namespaces/{bank['id']}/entries")).json()) == 2
    skipped = (await tenant.client.post(f"{API}/import", params={"onConflict": "skip"}, json=_body(document))).json()
    assert skipped["skipped"] == [f"{base}-a"] and skipped["entriesImported"] == 0
    assert len((await tenant.client.get(f"{API}/namespaces/{bank['id']}/entries")).json()) == 2

    # A stored agent-experience bank is refused as a merge target too, by name, not silently.
    stored = await tenant.namespace(f"{base}-stored", f"{MARKER} agent-2")
    onto = {"version": 1, "namespaces": [{"namespace": {"name": stored["name"], "description": ""},
                                          "entries": [{"content": "Would land in a prompt.", "source": "auto"}]}]}
    refused = (await tenant.client.post(f"{API}/import", json=_body(onto))).json()
    assert refused["refused"] == [stored["name"]] and refused["entriesImported"] == 0
    assert (await tenant.client.get(f"{API}/namespaces/{stored['id']}/entries")).json() == []
    single = {"namespace": {"name": "x", "description": f"{MARKER} agent-3"}, "entries": []}
    assert (await tenant.client.post(f"{API}/import", json=_body(single))).status_code == 400


async def test_request_refusals_and_secrets(tenant: Tenant, db: asyncpg.Connection) -> None:
    post = tenant.client.post
    good = {"version": 1, "namespaces": []}
    assert (await post(f"{API}/import", json={"data": good})).status_code == 422  # nested, not a string
    assert (await post(f"{API}/import", json={})).status_code == 422
    assert (await post(f"{API}/import", json={"data": "{not json"})).status_code == 400
    assert (await post(f"{API}/import", content=b"{not json", headers={"content-type": "application/json"})).status_code == 400
    assert (await post(f"{API}/import", json={"data": json.dumps({"version": 2, "namespaces": []})})).status_code == 400
    assert (await post(f"{API}/import", json={"data": json.dumps([1, 2])})).status_code == 400
    assert (await post(f"{API}/import", params={"on_conflict": "skip"}, json=_body(good))).status_code == 400
    assert (await post(f"{API}/import", params={"onConflict": "Skip"}, json=_body(good))).status_code == 400
    assert (await post(f"{API}/import", params={"onConflict": "overwrite"}, json=_body(good))).status_code == 400
    empty = await post(f"{API}/import", params={"onConflict": "skip"}, json=_body(good))
    assert empty.json() == {"created": [], "merged": [], "skipped": [], "refused": [], "entriesImported": 0}

    name = unique("leaky")
    leaky = {"version": 1, "namespaces": [{"namespace": {"name": name, "description": ""}, "entries": [
        {"content": "A harmless fact.", "source": "manual"},
        {"content": "aws key AKIAIOSFODNN7EXAMPLE secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "source": "manual"},
    ]}]}
    reply = await post(f"{API}/import", json=_body(leaky))
    assert reply.status_code == 400 and "namespaces[0].entries[1].content" in reply.json()["message"]
    # One transaction: nothing of the refused document was kept.
    assert await db.fetchval("SELECT count(*) FROM memory_namespaces WHERE name = $1", name) == 0
    assert await db.fetchval("SELECT count(*) FROM fragments WHERE content = 'A harmless fact.' AND key_id = $1", tenant.key_id) == 0


async def test_import_body_limit_is_50_mib(tenant: Tenant) -> None:
    over = b'{"data": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    reply = await tenant.client.post(f"{API}/import", content=over, headers={"content-type": "application/json"})
    assert reply.status_code == 413
    # Every other path keeps the 1 MiB default.
    big = {"name": "n", "description": "d" * (1024 * 1024)}
    assert (await tenant.client.post(f"{API}/namespaces", json=big)).status_code == 413
    # 2 MiB under the import path is taken (and refused by content, not by size).
    taken = await tenant.client.post(f"{API}/import", json={"data": "x" * (2 * 1024 * 1024)})
    assert taken.status_code == 400


async def test_ten_thousand_entries_round_trip_losslessly(stack, tenant: Tenant, other_tenant: Tenant) -> None:
    namespaces = []
    for n in range(4):
        entries = [
            {"id": f"src-{n}-{i}", "namespaceId": "src", "content": f"Bank {n} fact {i}: the service sharding key is tenant-{i % 97} ✓",
             "source": "manual" if i % 3 else "auto", "tags": [f"bank{n}", f"t{i % 7}"] if i % 5 else [],
             "metadata": {"i": i, "nested": {"ok": i % 2 == 0, "ratio": i / 7}} if i % 4 else {},
             "createdAt": f"2025-0{1 + n}-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}Z",
             "updatedAt": f"2025-0{1 + n}-02T00:00:00.{i:06d}Z"}
            for i in range(2500)
        ]
        namespaces.append({"namespace": {"id": f"src-{n}", "name": unique(f"bulk{n}"), "description": f"bank {n}",
                                         "enabled": n != 2, "createdAt": "2025-01-01T00:00:00Z",
                                         "updatedAt": "2025-01-01T00:00:00Z"},
                           "entries": entries})
    document = {"version": 1, "exportedAt": "2026-01-01T00:00:00Z", "namespaces": namespaces}
    imported = (await tenant.client.post(f"{API}/import", json=_body(document))).json()
    assert imported["entriesImported"] == 10_000 and len(imported["created"]) == 4

    exported = (await tenant.client.get(f"{API}/export")).json()
    assert exported["version"] == 1
    restored = (await other_tenant.client.post(f"{API}/import", json={"data": json.dumps(exported)})).json()
    assert restored["entriesImported"] == 10_000
    again = (await other_tenant.client.get(f"{API}/export")).json()

    def comparable(doc: dict[str, Any]) -> list[Any]:
        blocks = [({k: v for k, v in block["namespace"].items() if k != "id"}, _without_ids(block["entries"]))
                  for block in doc["namespaces"]]
        return sorted(blocks, key=lambda block: block[0]["name"])

    assert comparable(again) == comparable(exported)
    by_name = {block["namespace"]["name"]: block for block in again["namespaces"]}
    for source in namespaces:
        block = by_name[source["namespace"]["name"]]
        assert block["namespace"]["enabled"] == source["namespace"]["enabled"]
        assert _normalised(block["entries"]) == _normalised(source["entries"])
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers={"X-API-Key": other_tenant.key}) as http:
        assert (await http.get(f"{API}/stats")).json()["totalEntries"] == 10_000
