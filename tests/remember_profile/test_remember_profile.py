"""The remember profile (reference 003) at /mcp/remember-profile, over the mcp SDK client:
remember(content, path, create_project) resolves the path to an owner project / namespace,
refuses writes outside the key's scope, reserved identity metadata and secrets, replies with
exactly the documented fields, and a scoped search_memory confirms the write. The same store
as /mcp: what the profile stores is recalled there by the same tenant only."""

from __future__ import annotations

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.support import Stack, call, create_api_key, mcp_session, unique

REPLY_FIELDS = {"reference", "path", "writer", "account", "device_label"}
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _url(stack: Stack) -> str:
    return f"{stack.gateway_url}/mcp/remember-profile"


def _profile(stack: Stack, key: str, device: str | None = "laptop-1"):  # type: ignore[no-untyped-def]
    return mcp_session(_url(stack), key, headers={"X-Device-Label": device} if device else None)


async def _raw(session, tool: str, arguments: dict) -> tuple[dict, bool]:  # type: ignore[no-untyped-def]
    result = await session.call_tool(tool, arguments)
    return result.structured_content, bool(result.is_error)


async def test_tools_are_remember_and_the_read_tools_with_exactly_the_documented_parameters(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url)
    async with _profile(stack, key) as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
    assert set(listed) == {"remember", "search_memory", "recall", "recall_context"}
    schema = listed["remember"].input_schema
    assert set(schema["properties"]) == {"content", "path", "create_project"}
    assert sorted(schema["required"]) == ["content", "path"]
    assert schema["properties"]["create_project"]["default"] is False
    assert schema["additionalProperties"] is False
    assert listed["search_memory"].annotations.read_only_hint is True


async def test_remember_into_a_project_then_confirm_through_a_scoped_search(stack: Stack) -> None:
    name = unique("writer")
    key, key_id = await create_api_key(stack.database_url, name=name)
    project = unique("memory-os")
    path = f"projects/{project}/decisions"
    content = f"Use OAuth for hosted ChatGPT connections ({project})."
    async with _profile(stack, key) as s:
        refused, is_error = await _raw(s, "remember", {"content": content, "path": path})
        assert is_error and refused["error"] == "authorization_failure" and "create_project" in refused["message"]

        reply, is_error = await _raw(s, "remember", {"content": content, "path": f"/{path}/", "create_project": True})
        assert not is_error, reply
        assert set(reply) == REPLY_FIELDS
        assert reply["path"] == path and reply["writer"] == name and reply["account"] == key_id
        assert reply["device_label"] == "laptop-1"
        # The project exists now: no create_project needed for the next write.
        again, is_error = await _raw(s, "remember", {"content": f"Rotate the signing keys monthly ({project}).", "path": path})
        assert not is_error and again["reference"] != reply["reference"]

        found = await call(s, "search_memory", {"query": "OAuth for hosted ChatGPT connections", "limit": 3, "path": path})
        refs = [m["reference"] for m in found["memories"]]
        assert reply["reference"] in refs
        assert all(m["path"] == path for m in found["memories"])
        whole = await call(s, "search_memory", {"query": "signing keys rotation", "path": f"projects/{project}"})
        assert again["reference"] in [m["reference"] for m in whole["memories"]]
        elsewhere = await call(s, "search_memory", {"query": "OAuth for hosted ChatGPT connections", "path": f"projects/{unique('other')}"})
        assert elsewhere["memories"] == []
        pack = await call(s, "recall_context", {"path": f"projects/{project}"})
        assert {reply["reference"], again["reference"]} <= {m["reference"] for m in pack["memories"]}
        related = await call(s, "recall", {"path": path})
        assert reply["reference"] in [m["reference"] for m in related["memories"]]

    # The same store as /mcp: the owner project is the workspace, the rest of the path the topic.
    async with mcp_session(stack.mcp_url, key) as m:
        recalled = await call(m, "recall", {"text": "OAuth for hosted ChatGPT connections", "workspace": project, "topic": "decisions"})
    stored = {f["id"]: f for f in recalled["fragments"]}
    assert stored[reply["reference"]]["type"] == "decision" and stored[reply["reference"]]["workspace"] == project


async def test_writes_outside_the_keys_allowed_workspaces_are_refused(stack: Stack) -> None:
    allowed = unique("alpha")
    key, _ = await create_api_key(stack.database_url, allowed_workspaces=[allowed])
    async with _profile(stack, key) as s:
        outside, is_error = await _raw(s, "remember", {
            "content": "Deploys go out on Tuesdays only.", "path": f"projects/{unique('beta')}/decisions", "create_project": True})
        assert is_error and outside["error"] == "authorization_failure"
        namespace, is_error = await _raw(s, "remember", {"content": "Deploys go out on Tuesdays only.", "path": "preferences/deploys"})
        assert is_error and namespace["error"] == "authorization_failure"
        inside, is_error = await _raw(s, "remember", {
            "content": "Deploys go out on Tuesdays only.", "path": f"projects/{allowed}/decisions", "create_project": True})
        assert not is_error and set(inside) == REPLY_FIELDS
        team, is_error = await _raw(s, "remember", {"content": "Team wide rule for releases.", "path": "teams/platform/rules"})
        assert is_error and team["error"] == "authorization_failure"


async def test_reserved_identity_metadata_secrets_and_malformed_values_are_refused(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url, name="honest-writer")
    ns = unique("notes")
    async with _profile(stack, key) as s:
        spoof, is_error = await _raw(s, "remember", {"content": "I am someone else entirely.", "path": ns, "writer": "ceo"})
        assert is_error and spoof["error"] == "safety_rejection" and "writer" in spoof["message"]
        spoof, is_error = await _raw(s, "remember", {"content": "Pretend device label here.", "path": ns, "device_label": "x"})
        assert is_error and spoof["error"] == "safety_rejection"
        identity, is_error = await _raw(s, "remember", {"content": "Who I really am, as data.", "path": "identity/me"})
        assert is_error and identity["error"] == "safety_rejection"
        secret, is_error = await _raw(s, "remember", {"content": f"The CI token is {TOKEN} for deploys.", "path": ns})
        assert is_error and secret["error"] == "safety_rejection" and "secret" in secret["message"]
        found = await call(s, "search_memory", {"query": "CI token for deploys", "path": ns})
        assert found["memories"] == []

        for bad in ({"content": "", "path": ns}, {"content": "A fine memory to keep.", "path": ""},
                    {"content": "A fine memory to keep.", "path": ns, "topic": "x"},
                    {"content": "A fine memory to keep.", "path": ns, "create_project": "yes"},
                    {"content": "A fine memory to keep."}):
            with pytest.raises(MCPError) as invalid:
                await s.call_tool("remember", bad)
            assert invalid.value.error.code == -32602
        long_fact, is_error = await _raw(s, "remember", {"content": "word " * 100, "path": ns})
        assert is_error and long_fact["error"] == "validation_failure" and "300" in long_fact["message"]
        note, is_error = await _raw(s, "remember", {"content": "Handoff: " + "the migration is half done; " * 30, "path": f"{ns}/handoffs"})
        assert not is_error and note["writer"] == "honest-writer"


async def test_two_tenants_have_their_own_projects_and_never_see_each_others_memories(stack: Stack) -> None:
    key_a, _ = await create_api_key(stack.database_url)
    key_b, _ = await create_api_key(stack.database_url)
    project = unique("shared-name")
    path = f"projects/{project}/facts"
    async with _profile(stack, key_a) as a:
        first = {"content": f"Tenant A's private fact about {project}.", "path": path, "create_project": True}
        stored, _ = await _raw(a, "remember", first)
    async with _profile(stack, key_b, device=None) as b:
        # A's project is not B's: B cannot write into it without creating its own.
        refused, is_error = await _raw(b, "remember", {"content": f"Tenant B's fact about {project}.", "path": path})
        assert is_error and refused["error"] == "authorization_failure"
        seen = await call(b, "search_memory", {"query": f"private fact about {project}", "path": path})
        assert stored["reference"] not in [m["reference"] for m in seen["memories"]]
        own, is_error = await _raw(b, "remember", {"content": f"Tenant B's fact about {project}.", "path": path, "create_project": True})
        assert not is_error and own["device_label"] == "unlabeled"
    async with _profile(stack, key_a) as a:
        mine = await call(a, "search_memory", {"query": f"fact about {project}", "path": path, "limit": 10})
    refs = [m["reference"] for m in mine["memories"]]
    assert stored["reference"] in refs and own["reference"] not in refs


async def test_a_read_only_key_may_search_but_not_remember_and_no_key_is_401(stack: Stack) -> None:
    key, _ = await create_api_key(stack.database_url, permissions=["read"])
    async with _profile(stack, key) as s:
        refused, is_error = await _raw(s, "remember", {"content": "A read-only key tries to write.", "path": unique("ns")})
        assert is_error and refused["error"] == "forbidden" and "memory:write" in refused["message"]
        assert (await call(s, "search_memory", {"query": "anything at all"}))["memories"] is not None
    async with httpx.AsyncClient() as http:
        response = await http.post(_url(stack), json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                   headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 401
