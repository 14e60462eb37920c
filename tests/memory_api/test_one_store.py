"""One store (issue 19 item 2): an entry written over REST is a fragment MCP recall finds, a
fragment remembered over MCP is an entry of the namespace its topic names, and two keys
never see each other's namespaces or entries (the master key sees both)."""

from __future__ import annotations

from tests.memory_api.conftest import API, Tenant
from tests.support import call, mcp_session, unique


async def test_rest_entry_is_recalled_over_mcp_and_mcp_fragment_is_an_entry(stack, tenant: Tenant) -> None:
    ns = await tenant.namespace(unique("Pets"), "what the user told us about pets")
    entry = await tenant.entry(ns["id"], "Caroline adopted a golden retriever puppy named Max last spring.", tags=["family"])
    async with mcp_session(stack.mcp_url, tenant.key) as session:
        # A paraphrase sharing no word with the entry: found by meaning, so it was embedded.
        found = await call(session, "recall", {"text": "What dog does she own?"})
        assert entry["id"] in [f["id"] for f in found["fragments"]]
        # The namespace's name is the fragment's topic.
        by_topic = await call(session, "recall", {"topic": ns["name"]})
        assert [f["id"] for f in by_topic["fragments"]] == [entry["id"]]
        remembered = await call(session, "remember", {"content": "Max the retriever is afraid of thunderstorms.",
                                                      "topic": ns["name"], "type": "fact"})
        elsewhere = await call(session, "remember", {"content": "The CI runners moved to arm64 machines in May.",
                                                     "topic": unique("infra"), "type": "fact"})
    listed = (await tenant.client.get(f"{API}/namespaces/{ns['id']}/entries")).json()
    assert [e["id"] for e in listed] == [entry["id"], remembered["id"]]
    mcp_entry = listed[1]
    assert mcp_entry["source"] == "auto" and mcp_entry["namespaceId"] == ns["id"]
    # A topic no namespace has yet becomes one (named by the topic) with its fragment.
    namespaces = {n["name"]: n for n in (await tenant.client.get(f"{API}/namespaces")).json()}
    infra = [n for name, n in namespaces.items() if name.startswith("infra-")]
    assert len(infra) == 1
    assert [e["id"] for e in (await tenant.client.get(f"{API}/namespaces/{infra[0]['id']}/entries")).json()] == [elsewhere["id"]]
    # Deleting the namespace deletes its fragments: MCP no longer finds them.
    assert (await tenant.client.delete(f"{API}/namespaces/{ns['id']}")).status_code == 204
    async with mcp_session(stack.mcp_url, tenant.key) as session:
        after = await call(session, "recall", {"topic": ns["name"]})
    assert after["fragments"] == []


async def test_two_keys_are_isolated_and_the_master_sees_both(stack, tenant: Tenant, other_tenant: Tenant, master: Tenant) -> None:
    mine = await tenant.namespace(unique("mine"))
    secret_entry = await tenant.entry(mine["id"], "Tenant A's private launch date is March 3rd.")
    theirs = await other_tenant.namespace(unique("theirs"))
    await other_tenant.entry(theirs["id"], "Tenant B keeps its own notes here.")

    other = other_tenant.client
    assert mine["id"] not in [n["id"] for n in (await other.get(f"{API}/namespaces")).json()]
    assert (await other.get(f"{API}/namespaces/{mine['id']}")).status_code == 404
    assert (await other.get(f"{API}/namespaces/{mine['id']}/entries")).status_code == 404
    assert (await other.get(f"{API}/namespaces/{mine['id']}/entries/{secret_entry['id']}")).status_code == 404
    assert (await other.put(f"{API}/namespaces/{mine['id']}", json={"name": "stolen"})).status_code == 404
    assert (await other.post(f"{API}/namespaces/{mine['id']}/entries", json={"content": "x y z", "source": "auto"})).status_code == 404
    assert (await other.delete(f"{API}/namespaces/{mine['id']}/entries/{secret_entry['id']}")).status_code == 404
    assert (await other.delete(f"{API}/namespaces/{mine['id']}")).status_code == 404
    assert (await other.post(f"{API}/namespaces/{mine['id']}/export")).status_code == 404
    bulk = await other.post(f"{API}/namespaces/{theirs['id']}/entries/bulk-delete", json={"ids": [secret_entry["id"]]})
    assert bulk.json() == {"deleted": 0, "missing": [secret_entry["id"]]}
    moved = await other.post(f"{API}/namespaces/{theirs['id']}/entries/move",
                             json={"ids": [secret_entry["id"]], "targetNamespaceId": mine["id"]})
    assert moved.status_code == 404
    found = (await other.get(f"{API}/entries", params={"q": "launch date March"})).json()
    assert secret_entry["id"] not in [e["id"] for e in found]
    assert "launch date" not in (await other.get(f"{API}/context", params={"recordReference": "false"})).json()["content"]
    assert "launch date" not in (await other.get(f"{API}/export")).text
    enabled = (await other.get(f"{API}/entries/enabled")).json()
    assert secret_entry["id"] not in [e["id"] for e in enabled]
    stats = (await other.get(f"{API}/stats")).json()
    assert mine["id"] not in [n["namespaceId"] for n in stats["perNamespace"]]
    async with mcp_session(stack.mcp_url, other_tenant.key) as session:
        recalled = await call(session, "recall", {"text": "private launch date"})
    assert secret_entry["id"] not in [f["id"] for f in recalled.get("fragments", [])]
    # Still there for its owner, untouched.
    assert (await tenant.client.get(f"{API}/namespaces/{mine['id']}/entries/{secret_entry['id']}")).json() == secret_entry

    everything = {n["id"] for n in (await master.client.get(f"{API}/namespaces")).json()}
    assert {mine["id"], theirs["id"]} <= everything
    assert (await master.client.get(f"{API}/namespaces/{mine['id']}/entries/{secret_entry['id']}")).json() == secret_entry
