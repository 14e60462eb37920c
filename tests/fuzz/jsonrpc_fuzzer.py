"""A seeded JSON-RPC fuzzer for POST /mcp: broken envelopes, wrong ids, other methods with odd
params, and every tool with mutated arguments (wrong types, huge strings, NUL, unicode edge
cases, NaN / Infinity, deep nesting, out-of-range numbers, empty and unknown fields).

Every reply must be a JSON-RPC result or a client error; an internal error (-32603, or the
SDK's code 0 for an exception it did not expect), an HTTP 5xx, a 202 for a request that has
an id, or no reply within the per-request timeout is a finding."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.gateway.wire import ACCEPT, INIT

# The codes a caller may be answered with: parse error, invalid request, unknown method,
# invalid params; the reference's policy violation (-32003) and daily limit (-32000); MCP's
# unsupported protocol version (-32022, a bad MCP-Protocol-Version header).
CLIENT_ERRORS = {-32700, -32600, -32601, -32602, -32003, -32000, -32022}
REQUEST_TIMEOUT_S = 30.0

# A valid call of each tool; the fuzzer mutates some of its fields (and the schema's others).
BASE_ARGUMENTS: dict[str, dict[str, Any]] = {
    "remember": {"content": "The fuzzer stores one sentence about cache eviction.", "topic": "fuzz", "type": "fact"},
    "batch_remember": {"fragments": [{"content": "A fuzzed batch item about queue depth.", "topic": "fuzz", "type": "fact"}]},
    "batch_status": {"jobId": "batch-1-deadbeef"},
    "forget": {"id": "frag-0000000000000000"},
    "amend": {"id": "frag-0000000000000000", "content": "An amended sentence about retries."},
    "link": {"fromId": "frag-0000000000000000", "toId": "frag-0000000000000001"},
    "reflect": {"summary": ["The fuzz session learned that inputs are checked."]},
    "recall": {"text": "cache eviction"},
    "context": {},
    "search_traces": {"keyword": "cache"},
    "reconstruct_history": {"caseId": "case-fuzz"},
    "graph_explore": {"startId": "frag-0000000000000000"},
    "fragment_history": {"id": "frag-0000000000000000"},
    "memory_stats": {},
    "tool_feedback": {"tool_name": "recall", "relevant": True, "sufficient": True},
    "get_skill_guide": {},
    "session_rotate": {"reason": "fuzz"},
    "memory_consolidate": {"wait": False},
}

UNICODE_EDGES = [
    "\u202eevil", "\ufeffbom", "😀" * 500, "e\u0301" * 200, "한국어 기억", "\uffff", "\x7f\x1b[31m", "\u2028\u2029",
    "'; DROP TABLE fragments; --", "%s%n%x", "${jndi:ldap://x/a}", "../../etc/passwd", "\\", '"', "\r\n\t",
    "\U0010ffff", "\u0000", "a\u0000b", "\ud800", "x\udfffy",
]
DATES = ["2026-13-45", "not a date", "9999-12-31T23:59:59Z", "0000-01-01", "-infinity", "1970-01-01T00:00:00+99:00", "P1Y"]
NUMBERS = [0, -1, -(2**63) - 1, 2**63, 2**64, 10**30, 1.5, -1e308, 1e-320, float("nan"), float("inf"), float("-inf")]


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def mutant(rng: random.Random) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice([None, True, False, [], {}, [1, "a", None], {"a": {"b": []}}, ""])
    if kind == 1:
        return rng.choice(NUMBERS)
    if kind == 2:
        return rng.choice("ab\u00e9\u4e00 ") * rng.choice([201, 1001, 4001, 20_000, 200_000])
    if kind == 3:
        return rng.choice(UNICODE_EDGES)
    if kind == 4:
        return rng.choice(DATES)
    if kind == 5:
        return _nested(rng.choice([10, 60, 150, 400]))
    if kind == 6:
        return [mutant(rng) for _ in range(rng.randrange(1, 4))]
    if kind == 7:
        return ["k" * rng.choice([1, 100, 101])] * rng.choice([1, 51, 2000])
    return {rng.choice(["from", "to", "content", "\u0000", "x" * 300]): mutant(rng)}


@dataclass
class Finding:
    what: str
    body: str
    status: int | None
    reply: str

    def __str__(self) -> str:
        return f"{self.what}: HTTP {self.status} {self.reply[:300]!r} <- {self.body[:300]!r}"


@dataclass
class FuzzReport:
    sent: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


def encode(message: Any) -> bytes:
    # allow_nan: NaN and Infinity go out as the bare tokens a careless client would send.
    return json.dumps(message, allow_nan=True).encode()


class JsonRpcFuzzer:
    def __init__(self, http: httpx.AsyncClient, url: str, key: str, seed: int) -> None:
        self.http = http
        self.url = url
        self.key = key
        self.rng = random.Random(seed)
        self.session_id: str | None = None
        self.schemas: dict[str, dict[str, Any]] = {}
        self.report = FuzzReport()
        self._id = 1000

    def headers(self) -> dict[str, str]:
        headers = {**ACCEPT, "Authorization": f"Bearer {self.key}", "mcp-protocol-version": "2025-06-18"}
        if self.session_id:
            headers["mcp-session-id"] = self.session_id
        return headers

    async def open(self) -> None:
        response = await self.http.post(self.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {self.key}"})
        response.raise_for_status()
        self.session_id = response.headers["mcp-session-id"]
        await self.http.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers())
        if not self.schemas:
            listed = await self.http.post(self.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=self.headers())
            self.schemas = {t["name"]: t["inputSchema"] for t in listed.json()["result"]["tools"]}

    def next_id(self) -> int:
        self._id += 1
        return self._id

    # ------------------------------------------------------------------ messages
    def tool_call(self) -> dict[str, Any]:
        name = self.rng.choice(sorted(self.schemas))
        arguments: Any = dict(BASE_ARGUMENTS.get(name, {}))
        fields = sorted(self.schemas[name].get("properties", {})) + ["unknownField"]
        for _ in range(self.rng.randrange(1, 4)):
            arguments[self.rng.choice(fields)] = mutant(self.rng)
        if name == "batch_remember" and self.rng.random() < 0.5:
            item = dict(BASE_ARGUMENTS["remember"])
            item[self.rng.choice(sorted(self.schemas["remember"]["properties"]))] = mutant(self.rng)
            arguments["fragments"] = [item, *([dict(BASE_ARGUMENTS["remember"])] * self.rng.randrange(2))]
        if self.rng.random() < 0.05:
            arguments = self.rng.choice([[], "args", 7, None])  # arguments that are not an object
        return {"jsonrpc": "2.0", "id": self.next_id(), "method": "tools/call", "params": {"name": name, "arguments": arguments}}

    def other_method(self) -> dict[str, Any]:
        method, params = self.rng.choice([
            ("resources/read", {"uri": mutant(self.rng)}),
            ("resources/read", {"uri": self.rng.choice(["memory://stats", "memory://topics", "memory://nope", "file:///etc/passwd"])}),
            ("prompts/get", {"name": "retrieve-relevant-memory", "arguments": {"topic": mutant(self.rng)}}),
            ("prompts/get", {"name": mutant(self.rng)}),
            ("tools/call", {"name": mutant(self.rng), "arguments": {}}),
            ("tools/call", {"arguments": {}}),
            ("tools/list", {"cursor": mutant(self.rng)}),
            ("resources/list", mutant(self.rng)),
            ("no/such/method", {}),
            ("ping", {}),
            ("logging/setLevel", {"level": mutant(self.rng)}),
            ("completion/complete", {"ref": mutant(self.rng), "argument": {"name": "x", "value": "y"}}),
        ])
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id(), "method": method}
        if params is not None:
            message["params"] = params
        return message

    def broken_envelope(self) -> bytes:
        valid = encode({"jsonrpc": "2.0", "id": self.next_id(), "method": "tools/list"})
        choice = self.rng.randrange(8)
        if choice == 0:
            return bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200)))
        if choice == 1:
            return valid[: self.rng.randrange(1, len(valid))]
        if choice == 2:
            return encode({"jsonrpc": "2.0", "id": mutant(self.rng), "method": "tools/list"})
        if choice == 3:
            entries = [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"jsonrpc": "2.0", "id": mutant(self.rng), "method": "ping"}]
            return encode(entries)
        if choice == 4:
            return encode({"jsonrpc": mutant(self.rng), "id": 5, "method": mutant(self.rng), "params": mutant(self.rng)})
        if choice == 5:
            return encode(mutant(self.rng))
        if choice == 6:
            return b"[" * 5000 + b"]" * 5000
        return encode({"jsonrpc": "2.0", "method": self.rng.choice(["notifications/cancelled", "notifications/x"]),
                       "params": {"requestId": mutant(self.rng)}})

    # ------------------------------------------------------------------ sending
    async def send(self, body: bytes, expects_reply: bool) -> None:
        self.report.sent += 1
        text = body.decode(errors="replace")
        headers = self.headers()
        if self.rng.random() < 0.1:  # the HTTP side of MCP: mode preset and protocol version
            name = self.rng.choice(["x-memento-mode", "mcp-protocol-version"])
            headers[name] = self.rng.choice(["recall-only", "AUDIT", "nope", "", "x" * 5000, "1999-01-01", "2025-03-26"])
        try:
            response = await self.http.post(self.url, content=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
        except httpx.TimeoutException:
            self.report.findings.append(Finding("no reply within the timeout", text, None, ""))
            return
        if response.status_code == 404 and self.session_id:
            # session_rotate ended the session this request named: open another and go on.
            self.report.count("session rotated")
            await self.open()
            return
        self.check(text, response, expects_reply)

    def check(self, text: str, response: httpx.Response, expects_reply: bool) -> None:
        status = response.status_code
        if status >= 500:
            self.report.findings.append(Finding("HTTP 5xx", text, status, response.text))
            return
        if status == 202:
            if expects_reply:
                self.report.findings.append(Finding("202 and no reply to a request with an id", text, status, response.text))
            self.report.count("202")
            return
        if status in (413, 429):
            self.report.count(str(status))
            return
        try:
            reply = response.json()
        except ValueError:
            self.report.findings.append(Finding("a reply that is not JSON", text, status, response.text))
            return
        error = reply.get("error") if isinstance(reply, dict) else None
        if error is None:
            self.report.count("result")
            return
        code = error.get("code")
        self.report.count(str(code))
        if code not in CLIENT_ERRORS:
            self.report.findings.append(Finding(f"error code {code}", text, status, response.text))

    async def run(self, requests: int) -> FuzzReport:
        await self.open()
        for _ in range(requests):
            roll = self.rng.random()
            if roll < 0.6:
                message = self.tool_call()
                await self.send(encode(message), expects_reply=True)
            elif roll < 0.8:
                message = self.other_method()
                await self.send(encode(message), expects_reply=True)
            else:
                await self.send(self.broken_envelope(), expects_reply=False)
        return self.report
