"""What an agent reads: tools that describe every parameter, a cut that says it is a cut,
and links that point rather than repeat (issue 17, item 4), through MCP."""

from __future__ import annotations

from tests.support import Stack, call, create_api_key, mcp_session, unique

LONG = ("The payments vault path holds the Stripe keys of the checkout service, and rotating it requires "
        "a restart of every checkout replica, which the on-call engineer does through the deploy pipeline, "
        "never by hand, because a half-rotated fleet charges cards with two different keys for a while, "
        "and the reconciliation job flags every charge made with the retired key the next morning.")


async def test_tools_list_describes_every_parameter(mcp_url: str, master_key: str) -> None:
    async with mcp_session(mcp_url, master_key) as s:
        tools = (await s.list_tools()).tools
    undescribed = [
        f"{tool.name}.{name}" for tool in tools for name, prop in tool.input_schema.get("properties", {}).items()
        if not str(prop.get("description", "")).strip()
    ]
    assert len(tools) >= 18 and undescribed == []
    recall = next(t for t in tools if t.name == "recall")
    assert "`text`" in (recall.description or "")


async def test_tools_list_carries_the_standard_annotations(mcp_url: str, master_key: str) -> None:
    # Clients auto-approve on these hints; the reference's own `meta` stays beside them.
    async with mcp_session(mcp_url, master_key) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert all(t.annotations is not None for t in tools.values())
    recall, forget, remember = tools["recall"].annotations, tools["forget"].annotations, tools["remember"].annotations
    assert recall.read_only_hint is True and recall.destructive_hint is False
    assert forget.read_only_hint is False and forget.destructive_hint is True
    assert remember.read_only_hint is False and remember.destructive_hint is False


async def test_recall_takes_query_for_text(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        stored = await call(s, "remember", {"content": "The staging database listens on port 6543.", "topic": "db", "type": "fact", "workspace": ws})
        found = await call(s, "recall", {"query": "which port does the staging database use?", "workspace": ws})
    assert [f["id"] for f in found["fragments"]] == [stored["id"]]


async def test_a_cut_at_storage_is_reported(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        cut = await call(s, "remember", {"content": LONG, "topic": "vault", "type": "fact", "workspace": ws})
        whole = await call(s, "remember", {"content": LONG + " (episode)", "topic": "vault", "type": "episode", "workspace": ws})
        short = await call(s, "remember", {"content": "Vault paths are per environment.", "topic": "vault", "type": "fact", "workspace": ws})
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": LONG + " Batch copy.", "topic": "vault", "type": "decision"},
            {"content": "Vault audit logs go to the security bucket.", "topic": "vault", "type": "fact"}]})
    assert len(LONG) > 300
    assert (cut["truncated"], cut["content_length"], cut["stored_length"]) == (True, len(LONG), 300)
    assert cut["success"] is True and {"id", "keywords", "ttl_tier", "scope", "conflicts"} <= set(cut)
    assert "truncated" not in whole and "truncated" not in short
    first, second = batch["results"]
    assert (first["truncated"], first["content_length"]) == (True, len(LONG) + len(" Batch copy."))
    assert "truncated" not in second


async def test_links_point_instead_of_repeating(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        keys = await call(s, "remember", {"content": "The checkout service reads its Stripe keys from the payments vault path.",
                                          "topic": "checkout", "type": "fact", "workspace": ws})
        restart = await call(s, "remember", {"content": "Rotating the payments vault path requires restarting the checkout service.",
                                             "topic": "checkout", "type": "procedure", "workspace": ws})
        detail = await call(s, "remember", {"content": LONG, "topic": "vault-rotation", "type": "decision", "workspace": ws})
        await call(s, "link", {"fromId": restart["id"], "toId": keys["id"], "relationType": "related"})
        await call(s, "link", {"fromId": keys["id"], "toId": detail["id"], "relationType": "part_of"})
        # The topic filter keeps the long decision out of the results; it is only linked.
        reply = await call(s, "recall", {"text": "checkout Stripe keys vault", "workspace": ws, "topic": "checkout"})
    returned = {f["id"]: f for f in reply["fragments"]}
    assert set(returned) == {keys["id"], restart["id"]}
    # (The worker may add related links of its own between similar fragments.)
    links = {(link["id"], link["relation_type"]): link for link in returned[keys["id"]]["linked"]}
    # A result of the same reply is named by id, without repeating its content.
    assert links[(restart["id"], "related")] == {"id": restart["id"], "relation_type": "related", "direction": "in"}
    assert {"id": keys["id"], "relation_type": "related", "direction": "out"} in returned[restart["id"]]["linked"]
    assert all("content" not in link for f in returned.values() for link in f["linked"] if link["id"] in returned)
    # Not in the reply: a short preview whose cut is reported, enough to decide whether to recall it.
    far = links[(detail["id"], "part_of")]
    assert (far["direction"], far["type"]) == ("out", "decision")
    assert far["truncated"] is True and far["content_length"] == 300 and len(far["content"]) <= 81
    assert LONG.startswith(far["content"].rstrip("…"))
