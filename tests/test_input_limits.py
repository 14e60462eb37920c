"""Issue 15, finding 5: no input reaches Postgres unchecked. A NUL character, an oversized id,
an integer past bigint, NaN / Infinity and a malformed JSON-RPC envelope each get a client
error naming what is wrong (-32602 naming the field, -32600 / -32700 for the envelope), at
once, over /mcp and legacy /message; never -32603, a 5xx or a 202 without a reply."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.wire import RawMcp, rpc_body
from tests.support import Stack, call, create_api_key, mcp_session, unique

NUL = "a\x00b"
TEXT = "Engram keeps small atomic memories for agents."


def _nul_cases(fragment_id: str) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, the field the error must name): every string a tool takes."""
    remember = {"content": TEXT, "topic": "limits", "type": "fact"}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("remember", {**remember, "content": f"{TEXT} {NUL}"}, "content"),
        ("remember", {**remember, "keywords": ["ok", NUL]}, "keywords[1]"),
    ]
    for field in ("topic", "source", "sessionId", "workspace", "agentId", "caseId", "goal", "outcome", "phase",
                  "contextSummary", "idempotencyKey"):
        cases.append(("remember", {**remember, field: NUL}, field))
    cases += [
        ("remember", {**remember, "linkedTo": [NUL]}, "linkedTo[0]"),
        ("batch_remember", {"fragments": [remember], "agentId": NUL}, "agentId"),
        ("batch_remember", {"fragments": [remember], "workspace": NUL}, "workspace"),
        ("recall", {"text": NUL}, "text"),
        ("recall", {"keywords": [NUL]}, "keywords[0]"),
        ("recall", {"text": "x", "caseId": NUL}, "caseId"),
        ("recall", {"text": "x", "timeRange": {"from": NUL}}, "timeRange.from"),
        ("context", {"sessionId": NUL}, "sessionId"),
        # unknown arguments are ignored, but context() records them with its search event
        ("context", {"note": NUL}, "note"),
        ("forget", {"topic": NUL}, "topic"),
        ("forget", {"id": NUL}, "id"),
        ("amend", {"id": NUL, "content": TEXT}, "id"),
        ("amend", {"id": fragment_id, "phase": NUL}, "phase"),
        ("amend", {"id": fragment_id, "outcome": NUL}, "outcome"),
        ("link", {"fromId": fragment_id, "toId": NUL}, "toId"),
        ("reflect", {"summary": [NUL]}, "summary[0]"),
        ("reflect", {"summary": "done", "task_effectiveness": {"evidence": NUL}}, "task_effectiveness.evidence"),
        ("search_traces", {"keyword": NUL}, "keyword"),
        ("search_traces", {"case_id": NUL}, "case_id"),
        ("reconstruct_history", {"caseId": NUL}, "caseId"),
        ("reconstruct_history", {"caseId": "c", "query": NUL}, "query"),
        ("graph_explore", {"startId": NUL}, "startId"),
        ("fragment_history", {"id": NUL}, "id"),
        ("tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True, "suggestion": NUL}, "suggestion"),
        ("tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True, "fragment_ids": [NUL]}, "fragment_ids[0]"),
        ("batch_status", {"jobId": NUL}, "jobId"),
    ]
    return cases


async def _invalid_params(session: Any, tool: str, arguments: dict[str, Any]) -> str:
    with pytest.raises(MCPError) as refused:
        await session.call_tool(tool, arguments)
    assert refused.value.error.code == -32602, (tool, arguments, refused.value.error)
    return refused.value.error.message


async def test_nul_in_any_string_field_is_invalid_params_naming_it(mcp_url: str, master_key: str) -> None:
    ws = unique()
    async with mcp_session(mcp_url, master_key) as s:
        stored = await call(s, "remember", {"content": TEXT, "topic": "limits", "type": "fact", "workspace": ws})
        for tool, arguments, field in _nul_cases(stored["id"]):
            message = await _invalid_params(s, tool, arguments)
            assert f"{field}: must not contain the NUL character" in message, (tool, message)
        # a batch_remember item's strings too: the call is refused naming the item's field
        message = await _invalid_params(s, "batch_remember", {"workspace": ws, "fragments": [
            {"content": f"{TEXT} two", "topic": "limits", "type": "fact"},
            {"content": f"{TEXT} one", "topic": "limits", "type": "fact", "phase": NUL},
        ]})
        assert "fragments[1].phase: must not contain the NUL character" in message
        # nothing but the first fragment was written
        found = await call(s, "search_traces", {"workspace": ws, "keyword": "Engram"})
        assert found["count"] == 1


async def test_every_id_and_label_has_a_limit(mcp_url: str, master_key: str) -> None:
    remember = {"content": TEXT, "topic": "limits", "type": "fact", "workspace": unique()}
    huge = "s" * 500_000
    async with mcp_session(mcp_url, master_key) as s:
        for tool, arguments, field in [
            ("remember", {**remember, "sessionId": huge}, "sessionId"),
            ("remember", {**remember, "caseId": huge}, "caseId"),
            ("remember", {**remember, "agentId": "a" * 201}, "agentId"),
            ("remember", {**remember, "phase": "p" * 201}, "phase"),
            ("remember", {**remember, "keywords": ["k" * 15_000] * 50}, "keywords.0"),
            ("remember", {**remember, "keywords": ["k" * 101]}, "keywords.0"),
            ("recall", {"text": "x", "caseId": huge}, "caseId"),
            ("search_traces", {"sessionId": huge}, "sessionId"),
            ("context", {"sessionId": huge}, "sessionId"),
            ("tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True, "search_event_id": 2**63}, "search_event_id"),
            ("tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True, "search_event_id": 10**30}, "search_event_id"),
        ]:
            message = await _invalid_params(s, tool, arguments)
            assert f"{field}:" in message, (tool, field, message)
        # at the limit is served
        edge = await call(s, "remember", {**remember, "sessionId": "s" * 200, "caseId": "c" * 200, "agentId": "a" * 200,
                                          "phase": "p" * 200, "keywords": ["k" * 100]})
        assert edge["success"] is True
        # the largest bigint passes the limit and is looked up (there is no such event)
        message = await _invalid_params(s, "tool_feedback", {"tool_name": "recall", "relevant": True, "sufficient": True,
                                                             "search_event_id": 2**63 - 1})
        assert "no search event" in message
        # the limits are in the tools' input schemas
        tools = {t.name: t.input_schema for t in (await s.list_tools()).tools}
    props = tools["remember"]["properties"]
    assert props["agentId"]["anyOf"][0]["maxLength"] == 200
    assert props["keywords"]["anyOf"][0]["items"]["maxLength"] == 100
    assert props["goal"]["anyOf"][0]["maxLength"] == 1000
    assert tools["tool_feedback"]["properties"]["search_event_id"]["anyOf"][0]["maximum"] == 2**63 - 1


def _tools_call(request_id: Any, name: str, arguments_json: str) -> str:
    return ('{"jsonrpc": "2.0", "id": %s, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
            % (json.dumps(request_id), name, arguments_json))


async def test_nan_and_infinity_are_invalid_params(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, stack.master_key)
        await mcp.initialize()
        for i, number in enumerate(("Infinity", "-Infinity", "NaN", "1e999", "-1e999")):
            body = _tools_call(100 + i, "remember", '{"content": "%s", "topic": "limits", "type": "fact", "importance": %s}' % (TEXT, number))
            response = await http.post(mcp.url, content=body, headers=mcp._headers())  # noqa: SLF001
            assert response.status_code == 200, response.text
            reply = rpc_body(response)
            assert reply["id"] == 100 + i
            assert reply["error"]["code"] == -32602, reply
            assert "importance" in reply["error"]["message"]
        # nested, in a read tool, and in the gateway's own tool
        for i, (name, arguments) in enumerate((("recall", '{"text": "x", "threshold": NaN}'),
                                               ("recall", '{"text": "x", "timeRange": {"from": Infinity}}'),
                                               ("session_rotate", '{"reason": NaN}'))):
            response = await http.post(mcp.url, content=_tools_call(200 + i, name, arguments), headers=mcp._headers())  # noqa: SLF001
            reply = rpc_body(response)
            assert reply["id"] == 200 + i and reply["error"]["code"] == -32602, reply


BAD_IDS = ("1.5", "NaN", "{}", "[]", '{"a": 1}', "[1]", "null", "true", "1.0", "-Infinity")


def _with_id(raw_id: str) -> str:
    return '{"jsonrpc": "2.0", "id": %s, "method": "tools/list"}' % raw_id


def _invalid_request(response: httpx.Response) -> None:
    assert response.status_code == 400, (response.status_code, response.text)
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None, body
    assert body["error"]["code"] == -32600, body


async def test_invalid_jsonrpc_ids_get_an_immediate_invalid_request(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        mcp = RawMcp(http, stack.mcp_url, stack.master_key)
        await mcp.initialize()
        headers = mcp._headers()  # noqa: SLF001
        for raw_id in BAD_IDS:
            _invalid_request(await http.post(mcp.url, content=_with_id(raw_id), headers=headers))
        # a batch holding such an entry (MCP has no batches since 2025-06-18)
        _invalid_request(await http.post(mcp.url, content=f"[{_with_id('1')}, {_with_id('1.5')}]", headers=headers))
        _invalid_request(await http.post(mcp.url, content="[]", headers=headers))
        # other broken envelopes
        for body in ('"tools/list"', '{"jsonrpc": "2.0", "id": 3, "method": 5}', '{"jsonrpc": "1.0", "id": 3, "method": "tools/list"}'):
            _invalid_request(await http.post(mcp.url, content=body, headers=headers))
        parse = await http.post(mcp.url, content="{nope", headers=headers)
        assert parse.status_code == 400 and parse.json()["error"]["code"] == -32700
        # string and integer ids are served, and a notification still gets its 202
        for good in ('"req-1"', "7", "9007199254740993"):
            response = await http.post(mcp.url, content=_with_id(good), headers=headers)
            assert response.status_code == 200 and rpc_body(response)["id"] == json.loads(good)
        notification = await http.post(mcp.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        assert notification.status_code == 202
        # before the credential: still 401
        anonymous = await http.post(mcp.url, content=_with_id("1.5"),
                                    headers={k: v for k, v in headers.items() if k not in ("Authorization", "mcp-session-id")})
        assert anonymous.status_code == 401


@asynccontextmanager
async def _sse_endpoint(http: httpx.AsyncClient, gateway_url: str, key: str) -> AsyncIterator[tuple[str, asyncio.Queue[str]]]:
    """A legacy SSE session: its /message URL, and the data lines the stream carries."""
    lines: asyncio.Queue[str] = asyncio.Queue()
    async with http.stream("GET", f"{gateway_url}/sse?accessKey={key}") as stream:
        reader = aiter(stream.aiter_lines())
        endpoint = None
        while endpoint is None:
            line = await anext(reader)
            if line.startswith("data:"):
                endpoint = line[5:].strip()

        async def pump() -> None:
            async for line in reader:
                if line.startswith("data:"):
                    await lines.put(line[5:].strip())

        task = asyncio.create_task(pump())
        try:
            yield f"{gateway_url}{endpoint}", lines
        finally:
            task.cancel()


async def test_legacy_message_refuses_malformed_bodies_at_once_without_a_stack_trace(stack: Stack) -> None:
    raw, _ = await create_api_key(stack.database_url)
    log = stack.log_dir / "gateway.log"
    before = log.stat().st_size
    async with httpx.AsyncClient(timeout=30) as http, _sse_endpoint(http, stack.gateway_url, raw) as (url, lines):
        for raw_id in BAD_IDS:
            _invalid_request(await http.post(url, content=_with_id(raw_id)))
        _invalid_request(await http.post(url, content=f"[{_with_id('2')}]"))
        for garbage in ("{nope", "", "\x00\x01"):
            response = await http.post(url, content=garbage)
            assert response.status_code == 400 and response.json()["error"]["code"] == -32700, response.text
        # the session still works: initialize answers on the stream
        init = {"jsonrpc": "2.0", "id": "init-1", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
        assert (await http.post(url, json=init)).status_code == 202
        reply = json.loads(await asyncio.wait_for(lines.get(), 20))
        assert reply["id"] == "init-1" and "result" in reply
    logged = log.read_bytes()[before:].decode(errors="replace")
    assert "Traceback" not in logged and "Failed to parse message" not in logged


async def test_admin_rest_refuses_what_postgres_cannot_hold(stack: Stack) -> None:
    admin = "/v1/internal/model/nothing"
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers={"Authorization": f"Bearer {stack.master_key}"}, timeout=30) as http:
        _, key_id = await create_api_key(stack.database_url)
        for method, path in (("GET", f"{admin}/export?key_id=%00"), ("GET", f"{admin}/export?topic=a%00b"),
                             ("DELETE", f"{admin}/keys/a%00b"), ("GET", f"{admin}/groups/a%00b/members"),
                             ("POST", f"{admin}/sessions/a%00b/reflect")):
            response = await http.request(method, path)
            assert response.status_code == 422, (method, path, response.status_code, response.text)
        for method, path, body in (
            ("POST", f"{admin}/keys", {"name": NUL}),
            ("POST", f"{admin}/keys", {"name": unique(), "daily_limit": 2**31}),
            ("POST", f"{admin}/groups", {"name": NUL}),
            ("PUT", f"{admin}/keys/{key_id}/daily-limit", {"daily_limit": 2**40}),
            ("POST", f"{admin}/fsck", {"keyId": NUL, "scope": "key"}),
        ):
            response = await http.request(method, path, json=body)
            assert response.status_code == 422, (method, path, body, response.status_code, response.text)
        assert (await http.get(f"{admin}/maintenance/runs/{2**70}")).status_code == 422
        # the largest values that fit are served
        assert (await http.put(f"{admin}/keys/{key_id}/daily-limit", json={"daily_limit": 2**31 - 1})).status_code == 200
        assert (await http.get(f"{admin}/maintenance/runs/{2**63 - 1}")).status_code == 404
