"""POST /api/remember (reference 004) and the session summaries it writes (/api/sessions), on
a stack of its own whose worker the test can hold down: {"accepted": true} comes back at once,
the facts are stored by the worker through the job outbox, so a worker killed between the two
loses nothing once a worker runs again; role sets the point of view; stored memories join the
memory session (no echo on the next recall); REMEMBER_RATE_LIMIT; sessions list, get, delete
(delete_memories) and consolidate; two keys never see each other's sessions. The stack has an
LLM (a fake OpenAI-compatible server here): /api/memories/find searches the sub-queries it
writes; it answers extraction prompts with no JSON, so remember takes its deterministic path,
except for a text carrying INFER_MARKER / NOTHING_MARKER (/api/memories with infer=true)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.mnemory_api.helpers import api, eventually
from tests.support import Stack, create_api_key, in_one_window, new_stack_config, unique

RATE_LIMIT = 6
# What the fake LLM answers a find prompt: a query that matches the memory the test stores.
LLM_QUERY = "favourite kind of tea"
# An extraction prompt carrying one of these gets JSON facts / an empty JSON list.
INFER_MARKER = "Kestrel"
NOTHING_MARKER = "Hmm okay whatever then"
INFER_FACTS = [{"content": "User's dog is named Kestrel", "role": "user", "memory_type": "fact"},
               {"content": "User prefers hiking with the dog at dawn", "role": "user", "memory_type": "preference"}]


class _FakeLlm(BaseHTTPRequestHandler):
    """/chat/completions: sub-queries for a find prompt, prose (no JSON) for anything else."""

    prompts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        _FakeLlm.prompts.append(system)
        answer = f"{LLM_QUERY}\nbeverages the user enjoys" if "search queries" in system else "Nothing to extract."
        if system.startswith("Extract durable facts") and INFER_MARKER in user:
            answer = "Here you go:\n" + json.dumps(INFER_FACTS)
        elif system.startswith("Extract durable facts") and NOTHING_MARKER in user:
            answer = "[]"
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def own(stack: Stack, stack_dir: Path) -> Iterator[Stack]:
    llm = ThreadingHTTPServer(("127.0.0.1", 0), _FakeLlm)
    threading.Thread(target=llm.serve_forever, daemon=True).start()
    # restart=False: the test holds the worker down, then starts it.
    config = new_stack_config(stack_dir / "mnemory-remember", database_url=stack.database_url, restart=False)
    config.extra_env = {**config.extra_env, "REMEMBER_RATE_LIMIT": str(RATE_LIMIT),
                        "LLM_BASE_URL": f"http://127.0.0.1:{llm.server_address[1]}", "LLM_MODEL": "fake"}
    with Stack(config) as running:
        yield running
    llm.shutdown()


async def test_find_searches_the_llm_sub_queries(own: Stack) -> None:
    key, _ = await create_api_key(own.database_url)
    async with api(own.gateway_url, key) as c:
        tea = (await c.post("/api/memories", json={"content": "User's favourite tea is a smoky lapsang souchong",
                                                   "memory_type": "preference"})).json()["results"][0]["id"]
        # The question alone matches nothing; the LLM's sub-query does.
        question = {"question": "zqxj vprk wmbt?"}
        assert not (await c.post("/api/memories/search", json={"query": question["question"]})).json()["results"]
        found = (await c.post("/api/memories/find", json=question)).json()["results"]
        assert [r["id"] for r in found] == [tea]
        assert any("search queries" in p for p in _FakeLlm.prompts)


async def _labelled(c: httpx.AsyncClient, marker: str) -> list[dict[str, Any]]:
    reply = await c.get("/api/memories", params={"labels": json.dumps({"conversation_id": marker})})
    results: list[dict[str, Any]] = reply.json()["results"]
    return results


async def _stored(c: httpx.AsyncClient, marker: str, count: int) -> list[dict[str, Any]]:
    """The conversation's memories once `count` of them are stored (the job stores them one by one)."""
    async def enough() -> list[dict[str, Any]]:
        found = await _labelled(c, marker)
        return found if len(found) >= count else []

    stored: list[dict[str, Any]] = await eventually(enough, timeout=180)
    return stored


def _exchange(marker: str, user: str, assistant: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant},
                         {"role": "system", "content": "Recalled: the user likes opera."}],
            "labels": {"conversation_id": marker}, **extra}


async def test_worker_killed_between_accept_and_processing_loses_nothing(own: Stack) -> None:
    key, _ = await create_api_key(own.database_url)
    marker = unique("conv")
    async with api(own.gateway_url, key) as c:
        session_id = (await c.post("/api/recall", json={"query": "hello"})).json()["session_id"]
        worker = own.processes["worker"]
        worker.signal(signal.SIGKILL)
        await asyncio.to_thread(worker.process.wait, 30)  # type: ignore[union-attr]
        reply = await c.post("/api/remember", json=_exchange(
            marker, "I just moved to Berlin. I really love the lakes around the city. Is it cold in winter?",
            "That's exciting! Berlin winters are cold.", session_id=session_id))
        assert reply.status_code == 200 and reply.json() == {"accepted": True}
        await asyncio.sleep(3)
        assert await _labelled(c, marker) == []  # nobody is consuming: the job waits
        worker.start()
        stored = await _stored(c, marker, 2)
        contents = sorted(m["memory"] for m in stored)
        # role null without an agent: the user's statements only (the question and the system message are not facts).
        assert contents == ["User: I just moved to Berlin.", "User: I really love the lakes around the city."]
        kinds = {m["memory"]: (m["metadata"]["memory_type"], m["metadata"]["memory_layer"], m["metadata"]["role"]) for m in stored}
        assert kinds["User: I really love the lakes around the city."] == ("preference", "raw", "user")
        await asyncio.sleep(2)
        assert len(await _labelled(c, marker)) == 2  # a redelivered job stores nothing twice

        # The stored memories joined the memory session: the next recall does not echo them.
        echo = (await c.post("/api/recall", json={"session_id": session_id, "query": "Where did the user move to?"})).json()
        assert echo["session_id"] == session_id and echo["search_results"] == []
        fresh = (await c.post("/api/recall", json={"query": "Where did the user move to?"})).json()
        assert "User: I just moved to Berlin." in [r["memory"] for r in fresh["search_results"]]

        summary = (await c.get(f"/api/sessions/{session_id}")).json()
        assert summary["session_id"] == session_id and "User: I just moved to Berlin" in summary["summary"]
        assert "Recalled: the user likes opera" not in summary["summary"]  # system messages are never stored
        assert sorted(summary["memory_ids"]) == sorted(m["id"] for m in stored) and summary["consolidation_state"] == "idle"


async def test_role_sets_the_point_of_view(own: Stack) -> None:
    key, _ = await create_api_key(own.database_url)
    async with api(own.gateway_url, key) as c, api(own.gateway_url, key, agent="travel-bot") as agent:
        refused = await c.post("/api/remember", json=_exchange("x", "I hate flying.", "Noted.", role="assistant"))
        assert refused.status_code == 422 and "X-Agent-Id" in refused.json()["detail"]
        as_agent = unique("conv")
        assert (await agent.post("/api/remember", json=_exchange(
            as_agent, "Book me a train to Vienna please.", "I always recommend the night train for Vienna.", role="assistant",
        ))).json() == {"accepted": True}
        stored = await _stored(agent, as_agent, 1)
        assert [(m["memory"], m["metadata"]["role"], m["metadata"].get("agent_id")) for m in stored] == [
            ("Assistant: I always recommend the night train for Vienna.", "assistant", "travel-bot")]
        both = unique("conv")
        await agent.post("/api/remember", json=_exchange(both, "My sister lives in Graz.", "I will suggest Graz stops from now on."))
        stored = await _stored(agent, both, 2)
        assert sorted(m["metadata"]["role"] for m in stored) == ["assistant", "user"]  # auto mode with an agent: both


async def test_remember_is_rate_limited_per_key(own: Stack) -> None:
    async def attempt_all() -> list[int]:
        key, _ = await create_api_key(own.database_url)
        async with api(own.gateway_url, key) as c:
            return [(await c.post("/api/remember", json=_exchange(unique("r"), "Nothing durable here?", "ok"))).status_code
                    for _ in range(RATE_LIMIT + 2)]

    codes = await in_one_window(attempt_all)  # the window may start mid-loop, not end in it
    assert 0 < codes.count(200) <= RATE_LIMIT and codes[-1] == 429, codes
    other, _ = await create_api_key(own.database_url)
    async with api(own.gateway_url, other) as o:
        assert (await o.post("/api/remember", json=_exchange(unique("r"), "Still nothing?", "ok"))).status_code == 200


async def test_sessions_list_get_delete_and_consolidate(own: Stack) -> None:
    key, _ = await create_api_key(own.database_url)
    other, _ = await create_api_key(own.database_url)
    marker = unique("conv")
    async with api(own.gateway_url, key) as c, api(own.gateway_url, other) as o:
        sessions = []
        for n, city in enumerate(["Oslo", "Bergen", "Tromso"]):
            sid = f"ses_{marker}_{n}"
            await c.post("/api/remember", json=_exchange(f"{marker}-{n}", f"I visited {city} last summer with friends.", "Nice.", session_id=sid))
            sessions.append(sid)
        await eventually(lambda: _all_listed(c, sessions), timeout=180)

        page = (await c.get("/api/sessions", params={"limit": 2, "sort_by": "created_at", "sort_dir": "asc"})).json()
        assert set(page) == {"sessions", "total", "offset", "limit", "has_more", "total_truncated"}
        assert page["total"] == 3 and page["limit"] == 2 and page["offset"] == 0 and page["has_more"] is True
        assert page["total_truncated"] is False and [s["session_id"] for s in page["sessions"]] == sessions[:2]
        assert set(page["sessions"][0]) >= {"session_id", "summary", "created_at", "updated_at", "consolidation_state"}
        rest = (await c.get("/api/sessions", params={"limit": 2, "offset": 2, "sort_by": "created_at", "sort_dir": "asc"})).json()
        assert [s["session_id"] for s in rest["sessions"]] == sessions[2:] and rest["has_more"] is False
        found = (await c.get("/api/sessions", params={"q": "BERGEN"})).json()
        assert [s["session_id"] for s in found["sessions"]] == [sessions[1]] and found["total"] == 1
        assert (await c.get("/api/sessions", params={"consolidation_state": "consolidated"})).json()["total"] == 0

        # Another key sees none of them.
        assert (await o.get("/api/sessions")).json()["total"] == 0
        assert (await o.get(f"/api/sessions/{sessions[0]}")).status_code == 404
        assert (await o.delete(f"/api/sessions/{sessions[0]}")).status_code == 404
        assert (await o.post(f"/api/sessions/{sessions[0]}/consolidate")).status_code == 404

        done = (await c.post(f"/api/sessions/{sessions[0]}/consolidate")).json()
        assert done["status"] == "consolidated" and done["session_id"] == sessions[0] and done["promoted"] == 1
        promoted = (await c.post("/api/memories/by-ids", json={"ids": done["consolidated_memory_ids"]})).json()["results"]
        assert [m["metadata"]["memory_layer"] for m in promoted] == ["consolidated"]
        assert (await c.get(f"/api/sessions/{sessions[0]}")).json()["consolidation_state"] == "consolidated"

        linked = (await c.get(f"/api/sessions/{sessions[1]}")).json()["memory_ids"]
        gone = (await c.delete(f"/api/sessions/{sessions[1]}", params={"delete_memories": "true"})).json()
        assert gone == {"deleted_session": True, "deleted_memories": len(linked)} and len(linked) == 1
        assert (await c.post("/api/memories/by-ids", json={"ids": linked})).json()["results"] == []
        kept = (await c.get(f"/api/sessions/{sessions[2]}")).json()["memory_ids"]
        assert (await c.delete(f"/api/sessions/{sessions[2]}")).json() == {"deleted_session": True, "deleted_memories": 0}
        assert len((await c.post("/api/memories/by-ids", json={"ids": kept})).json()["results"]) == 1
        assert (await c.get(f"/api/sessions/{sessions[2]}")).status_code == 404


async def _all_listed(c: httpx.AsyncClient, sessions: list[str]) -> bool:
    listed = (await c.get("/api/sessions", params={"limit": 200})).json()["sessions"]
    return {s["session_id"] for s in listed} >= set(sessions)


async def test_add_with_infer_runs_the_extraction(own: Stack) -> None:
    """reference 004: infer=true runs /api/remember's extraction synchronously (each fact an ADD,
    the caller's fields on all of them); infer=false stores the text as given; an LLM answer
    without JSON stores it as given and says so; an empty extraction stores nothing."""
    key, _ = await create_api_key(own.database_url)
    other, _ = await create_api_key(own.database_url)
    third, _ = await create_api_key(own.database_url)
    marker = unique("infer")
    text = f"So yeah, my dog {INFER_MARKER} and I go hiking at dawn, I love that more than sleeping in."
    async with api(own.gateway_url, key) as c, api(own.gateway_url, other) as o, api(own.gateway_url, third) as t:
        reply = await c.post("/api/memories", json={"content": text, "categories": ["personal"], "labels": {"m": marker}})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [(r["memory"], r["event"]) for r in body["results"]] == [(f["content"], "ADD") for f in INFER_FACTS]
        assert body["error"] is False and body["message"] == "infer: 2 fact(s) extracted"
        stored = (await c.post("/api/memories/by-ids", json={"ids": [r["id"] for r in body["results"]]})).json()["results"]
        got = sorted((m["memory"], m["metadata"]["memory_type"], m["metadata"]["categories"], m["metadata"]["labels"]) for m in stored)
        assert got == sorted((f["content"], f["memory_type"], ["personal"], {"m": marker}) for f in INFER_FACTS)
        # The caller's memory_type wins over the LLM's (another key: the same facts are new there).
        typed = (await t.post("/api/memories", json={"content": text, "memory_type": "episodic"})).json()
        assert [r["event"] for r in typed["results"]] == ["ADD", "ADD"]
        typed_stored = (await t.post("/api/memories/by-ids", json={"ids": [r["id"] for r in typed["results"]]})).json()["results"]
        assert {m["metadata"]["memory_type"] for m in typed_stored} == {"episodic"}
        # The other key sees none of the extracted memories.
        assert (await o.post("/api/memories/by-ids", json={"ids": [r["id"] for r in body["results"]]})).json()["results"] == []

        as_given = (await c.post("/api/memories", json={"content": text, "infer": False})).json()
        assert [r["memory"] for r in as_given["results"]] == [text] and as_given["message"] is None

        plain = "User keeps a spare key under the blue flower pot"
        unusable = (await c.post("/api/memories", json={"content": plain, "memory_type": "fact"})).json()
        assert [r["memory"] for r in unusable["results"]] == [plain]
        assert unusable["message"] == "infer: the LLM gave no usable answer, so the content was stored as given"

        nothing = (await c.post("/api/memories", json={"content": f"{NOTHING_MARKER} {marker}"})).json()
        assert nothing["results"] == [] and nothing["error"] is False and "nothing was stored" in nothing["message"]
        listed = (await c.get("/api/memories", params={"labels": json.dumps({"m": marker})})).json()["results"]
        assert sorted(m["memory"] for m in listed) == sorted(f["content"] for f in INFER_FACTS)
