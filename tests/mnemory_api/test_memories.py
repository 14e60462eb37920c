"""The mnemory REST surface's memory endpoints (reference 004) on the real stack: each endpoint
with its parameters, defaults, shapes and errors; one store with MCP (a memory added here is
recalled over MCP by the same key and the other way round); two keys never see each other's
memories through any read endpoint; /api/openapi.json and /api/docs are public, the
operations are not."""

from __future__ import annotations

import json

import httpx

from tests.mnemory_api.helpers import add, api, set_layer
from tests.support import Stack, call, create_api_key, mcp_session, unique


async def test_add_search_update_delete_round_trip(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    marker = unique("proj")
    async with api(stack.gateway_url, key) as c:
        reply = await c.post("/api/memories", json={
            "content": "User lives in Prague and flies gliders on weekends", "memory_type": "fact",
            "categories": ["personal", f"project:{marker}"], "importance": "high", "pinned": True,
            "labels": {"source": "web", "marker": marker}, "event_date": "2026-03-28",
        })
        assert reply.status_code == 200, reply.text
        body = reply.json()
        # infer defaults to true; without an LLM the content is stored as given and the reply says so.
        assert body["error"] is False and body["artifact"] is None and body["message"].startswith("infer: no LLM is configured")
        assert body["results"][0]["event"] == "ADD"
        assert body["results"][0]["memory"] == "User lives in Prague and flies gliders on weekends"
        memory_id = body["results"][0]["id"]

        # The query shares no word with the memory but "the user": found by meaning.
        found = (await c.post("/api/memories/search", json={"query": "Where does the user live?"})).json()["results"]
        assert found[0]["id"] == memory_id and 0.3 <= found[0]["score"] <= 1
        meta = found[0]["metadata"]
        assert meta["memory_type"] == "fact" and meta["importance"] == "high" and meta["pinned"] is True
        assert meta["categories"] == ["personal", f"project:{marker}"] and meta["role"] == "user"
        assert meta["memory_layer"] == "consolidated" and meta["labels"] == {"source": "web", "marker": marker}
        assert meta["event_date"].startswith("2026-03-28") and found[0]["has_artifacts"] is False

        # Filters: memory_type, categories (a prefix matches its subcategories), role, labels.
        search = {"query": "Where does the user live?"}
        assert not (await c.post("/api/memories/search", json={**search, "memory_type": "preference"})).json()["results"]
        assert [r["id"] for r in (await c.post("/api/memories/search", json={**search, "categories": ["project"]})).json()["results"]] == [memory_id]
        assert not (await c.post("/api/memories/search", json={**search, "role": "assistant"})).json()["results"]
        assert not (await c.post("/api/memories/search", json={**search, "labels": {"marker": "other"}})).json()["results"]
        assert (await c.post("/api/memories/search", json={**search, "date_start": "2026-03-29"})).json()["results"] == []

        listed = (await c.get("/api/memories", params={"labels": json.dumps({"marker": marker})})).json()["results"]
        assert [m["id"] for m in listed] == [memory_id] and listed[0]["score"] is None
        assert (await c.get("/api/memories", params={"memory_layer": "raw"})).json()["results"] == []
        assert (await c.get("/api/memories", params={"memory_layer": "bogus"})).status_code == 422
        assert (await c.get("/api/memories", params={"labels": "{not json"})).status_code == 422

        by_ids = (await c.post("/api/memories/by-ids", json={"ids": [memory_id, "frag-0000000000000000"]})).json()["results"]
        assert [m["id"] for m in by_ids] == [memory_id]

        updated = await c.put(f"/api/memories/{memory_id}", json={
            "importance": "low", "pinned": False, "categories": ["work"], "labels": {}, "memory_type": "preference"})
        assert updated.status_code == 200 and updated.json() == {"status": "updated", "memory_id": memory_id}
        meta = (await c.post("/api/memories/by-ids", json={"ids": [memory_id]})).json()["results"][0]["metadata"]
        assert (meta["importance"], meta["pinned"], meta["categories"], meta["memory_type"]) == ("low", False, ["work"], "preference")
        assert "labels" not in meta

        saved = await c.post(f"/api/memories/{memory_id}/artifacts", json={"content": "# Glider log\n", "filename": "log.md"})
        assert saved.status_code == 200, saved.text
        assert (await c.post("/api/memories/by-ids", json={"ids": [memory_id]})).json()["results"][0]["has_artifacts"] is True

        deleted = await c.delete(f"/api/memories/{memory_id}")
        assert deleted.status_code == 200 and deleted.json() == {"status": "deleted", "memory_id": memory_id}
        assert (await c.post("/api/memories/by-ids", json={"ids": [memory_id]})).json()["results"] == []
        assert (await c.delete(f"/api/memories/{memory_id}")).status_code == 404
        assert (await c.put(f"/api/memories/{memory_id}", json={"importance": "high"})).status_code == 404


async def test_refusals_name_what_is_wrong(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as c:
        bad_type = await c.post("/api/memories", json={"content": "The sky over the harbour was green", "memory_type": "dream"})
        assert bad_type.status_code == 422 and "memory_type" in bad_type.json()["detail"]
        bad_category = await c.post("/api/memories", json={"content": "The sky over the harbour was green", "categories": ["astrology"]})
        assert bad_category.status_code == 422 and "category" in bad_category.json()["detail"]
        assert (await c.post("/api/memories", json={"content": "x" * 4001})).status_code == 422
        assert (await c.post("/api/memories", json={"content": "The sky was green", "importance": "urgent"})).status_code == 422
        secret = await c.post("/api/memories", json={"content": "The CI user key is AKIAIOSFODNN7EXAMPLE in us-east-1."})
        assert secret.status_code == 422  # ENGRAM_SECRET_POLICY=reject (the default) refuses secrets on every write path
        remembered = await c.post("/api/remember", json={"messages": [{"role": "user", "content": "The CI user key is AKIAIOSFODNN7EXAMPLE in us-east-1."}]})
        assert remembered.status_code == 422 and "aws_access_key" in remembered.json()["detail"]  # refused before it is queued


async def test_batch_answers_each_item_in_place(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as c:
        reply = await c.post("/api/memories/batch", json={"memories": [
            {"content": "User prefers dark roast coffee in the morning", "memory_type": "preference"},
            {"content": "A memory with an invented category", "categories": ["astrology"]},
            {"content": "User's daughter starts school in September", "memory_type": "episodic", "categories": ["personal"]},
        ]})
        assert reply.status_code == 200, reply.text
        items = reply.json()
        assert [i["error"] for i in items] == [False, True, False]
        assert "category" in items[1]["message"] and items[1]["results"] == []
        ids = [items[0]["results"][0]["id"], items[2]["results"][0]["id"]]
        got = (await c.post("/api/memories/by-ids", json={"ids": ids})).json()["results"]
        assert [m["metadata"]["memory_type"] for m in got] == ["preference", "episodic"]
        again = (await c.post("/api/memories", json={"content": "User prefers dark roast coffee in the morning"})).json()
        assert again["results"][0] == {"id": ids[0], "memory": "User prefers dark roast coffee in the morning", "event": "NONE"}


async def test_find_core_recent_and_categories(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as c:
        pinned = await add(c, "User is allergic to peanuts", memory_type="fact", pinned=True, categories=["health"])
        pref = await add(c, "User prefers aisle seats on long flights", memory_type="preference", importance="high")
        trip = await add(c, "User booked a trip to Lisbon for the conference", memory_type="episodic", categories=["travel"])
        raw = await add(c, "User mentioned a dentist appointment on Friday", memory_type="episodic")
        await set_layer(stack.database_url, raw, "raw")  # a raw-layer memory, as /api/remember's job makes them

        found = (await c.post("/api/memories/find", json={"question": "What should I avoid cooking for the user? Any food allergy?"})).json()
        assert found["results"][0]["id"] == pinned

        core = await c.get("/api/memories/core")
        assert core.status_code == 200 and set(core.json()) == {"text"}
        text = core.json()["text"]
        assert "## User Facts\n- User is allergic to peanuts" in text
        assert "## User Preferences\n- User prefers aisle seats on long flights" in text
        assert "### User Activity" in text and "Lisbon" in text and "dentist" not in text  # raw layer excluded by default
        with_raw = (await c.get("/api/memories/core", params={"include_raw": "true"})).json()["text"]
        assert "dentist" in with_raw
        stats = (await c.get("/api/memories/core", params={"include_stats": "true"})).json()["stats"]
        assert set(stats) == {"memory_count", "char_count", "estimated_tokens", "by_type", "by_role", "by_section",
                              "section_labels", "sections", "memory_ids"}
        assert stats["sections"]["user_facts"] == [pinned] and stats["sections"]["user_preferences"] == [pref]
        assert stats["sections"]["recent_user_activity"] == [trip]
        assert stats["memory_ids"] == [pinned, pref, trip] and stats["memory_count"] == 3
        assert stats["by_type"] == {"fact": 1, "preference": 1, "episodic": 1} and stats["by_role"] == {"user": 3}
        assert stats["section_labels"] == {"user_facts": "User Facts", "user_preferences": "User Preferences",
                                           "recent_user_activity": "User Activity"}
        assert stats["char_count"] == len(text) and stats["estimated_tokens"] == (len(text) + 3) // 4
        no_recent = (await c.get("/api/memories/core", params={"recent_days": 0, "include_stats": "true"})).json()["stats"]
        assert "recent_user_activity" not in no_recent["sections"]

        recent = (await c.get("/api/memories/recent", params={"days": 7})).json()["text"]
        assert recent.startswith("## Recent Memories\n\n### User Activity\n- [") and "[travel] User booked a trip to Lisbon" in recent
        assert (await c.get("/api/memories/recent", params={"scope": "agent"})).status_code == 422

        categories = (await c.get("/api/categories")).json()
        counts = {cat["name"]: cat["count"] for cat in categories["categories"]}
        assert counts["health"] == 1 and counts["travel"] == 1 and counts["work"] == 0 and "project" in counts
        assert categories["total_memories"] == 4  # every live memory, the raw one too


async def test_one_store_with_mcp(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as c, mcp_session(stack.mcp_url, key) as s:
        rest_id = await add(c, "The staging cluster runs Postgres 18 on three nodes", memory_type="fact", categories=["technical"])
        recalled = await call(s, "recall", {"text": "which database version does staging use"})
        assert rest_id in [f["id"] for f in recalled["fragments"]]
        mcp = await call(s, "remember", {"content": "Release builds are signed with the hardware token in the safe",
                                         "topic": "security", "type": "procedure"})
        found = (await c.post("/api/memories/search", json={"query": "how are releases signed"})).json()["results"]
        mine = next(r for r in found if r["id"] == mcp["id"])
        assert mine["metadata"]["memory_type"] == "procedural" and mine["metadata"]["categories"] == []


async def test_two_keys_never_see_each_other(stack: Stack) -> None:
    alice, _ = await create_api_key(stack.database_url)
    bob, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, alice) as a, api(stack.gateway_url, bob) as b:
        secret_id = await add(a, "Alice keeps the spare house key under the blue flowerpot", memory_type="fact",
                              pinned=True, categories=["home"], labels={"owner": "alice"})
        await add(b, "Bob waters the plants on Sundays", memory_type="fact", categories=["home"])
        query = {"query": "where is the spare house key hidden"}
        assert secret_id not in [r["id"] for r in (await b.post("/api/memories/search", json=query)).json()["results"]]
        assert secret_id in [r["id"] for r in (await a.post("/api/memories/search", json=query)).json()["results"]]
        assert secret_id not in [r["id"] for r in (await b.post("/api/memories/find", json={"question": query["query"]})).json()["results"]]
        assert "flowerpot" not in (await b.get("/api/memories/core")).json()["text"]
        assert "flowerpot" not in (await b.get("/api/memories/recent")).json()["text"]
        assert secret_id not in [r["id"] for r in (await b.get("/api/memories", params={"limit": 5000})).json()["results"]]
        assert (await b.post("/api/memories/by-ids", json={"ids": [secret_id]})).json()["results"] == []
        assert {c["name"]: c["count"] for c in (await b.get("/api/categories")).json()["categories"]}["home"] == 1
        assert (await b.put(f"/api/memories/{secret_id}", json={"content": "moved"})).status_code == 404
        assert (await b.delete(f"/api/memories/{secret_id}")).status_code == 404
        recalled = (await b.post("/api/recall", json={"query": query["query"]})).json()
        assert secret_id not in [r["id"] for r in recalled["search_results"]] and "flowerpot" not in (recalled["core_memories"] or "")
        assert (await a.post("/api/memories/by-ids", json={"ids": [secret_id]})).json()["results"][0]["id"] == secret_id


async def test_openapi_and_docs_are_public_operations_are_not(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as c:
        document = (await c.get("/api/openapi.json")).json()
        for path in ("/api/memories", "/api/memories/search", "/api/memories/find", "/api/memories/core", "/api/recall",
                     "/api/remember", "/api/sessions", "/api/fsck/{check_id}/apply", "/api/categories"):
            assert path in document["paths"], path
        assert "bearer" in document["components"]["securitySchemes"]
        page = await c.get("/api/docs")
        assert page.status_code == 200 and "/api/docs/swagger-ui-bundle.js" in page.text and "cdn" not in page.text.lower()
        assert (await c.get("/api/docs/swagger-ui-bundle.js")).status_code == 200
        assert (await c.get("/api/docs/..%2Fsecret")).status_code == 404
        for method, path in (("GET", "/api/memories"), ("POST", "/api/memories/search"), ("GET", "/api/memories/core"),
                             ("GET", "/api/categories"), ("GET", "/api/sessions"), ("POST", "/api/recall"), ("POST", "/api/fsck")):
            assert (await c.request(method, path, json={"query": "x"})).status_code == 401, path
        assert (await c.get("/api/memories", headers={"X-API-Key": "mk_not_a_key"})).status_code == 401
    read_only, _ = await create_api_key(stack.database_url, permissions=["read"])
    async with api(stack.gateway_url, read_only, header="bearer") as c:
        assert (await c.get("/api/memories")).status_code == 200
        assert (await c.post("/api/memories", json={"content": "A read-only key cannot write this"})).status_code == 403


async def test_agent_scope_and_agent_sections_of_core(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with api(stack.gateway_url, key) as shared, api(stack.gateway_url, key, agent="bot-a") as a, \
            api(stack.gateway_url, key, agent="bot-b") as b:
        common = await add(shared, "User's name is Dana and she works as a nurse", memory_type="fact", pinned=True)
        identity = await add(a, "I am Bot A, a concise travel planner", memory_type="fact", role="assistant", pinned=True)
        rule = await add(a, "Always quote train prices in euros for the user", memory_type="procedural", pinned=True)
        core = (await a.get("/api/memories/core", params={"include_stats": "true"})).json()
        assert core["stats"]["sections"]["agent_identity"] == [identity]
        assert core["stats"]["sections"]["agent_instructions"] == [rule]
        assert core["stats"]["sections"]["user_facts"] == [common]
        assert core["text"].startswith("## Agent Identity\n- I am Bot A") and core["stats"]["by_role"] == {"assistant": 1, "user": 2}
        # bot-b sees the shared memory and none of bot-a's; without X-Agent-Id every memory of the key is listed.
        assert [m["id"] for m in (await b.get("/api/memories")).json()["results"]] == [common]
        assert {m["id"] for m in (await shared.get("/api/memories")).json()["results"]} == {common, identity, rule}
        assert (await b.put(f"/api/memories/{rule}", json={"importance": "low"})).status_code == 404
        assert (await b.delete(f"/api/memories/{identity}")).status_code == 404
        assert (await b.put(f"/api/memories/{common}", json={"agent_id": "bot-a"})).status_code == 403
        moved = await a.put(f"/api/memories/{common}", json={"agent_id": "bot-a"})
        assert moved.status_code == 200 and [m["id"] for m in (await b.get("/api/memories")).json()["results"]] == []
