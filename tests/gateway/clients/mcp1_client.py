"""Run by the mcp 1.x client's own venv (make test-clients): connect, list, call, print JSON.

usage: mcp1_client.py (http|sse) URL KEY WORKSPACE MARKER
"""

from __future__ import annotations

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client


async def exercise(session: ClientSession, workspace: str, marker: str) -> dict:
    init = await session.initialize()
    tools = await session.list_tools()
    stored = await session.call_tool(
        "remember",
        {"content": f"The mcp 1.x client stored {marker} through the gateway.", "topic": "clients", "type": "fact", "workspace": workspace},
    )
    found = await session.call_tool("recall", {"keywords": [marker], "workspace": workspace})
    prompts = await session.list_prompts()
    config = await session.read_resource("memory://config")
    return {
        "server": init.serverInfo.name,
        "tools": sorted(t.name for t in tools.tools),
        "stored": json.loads(stored.content[0].text),
        "found": json.loads(found.content[0].text),
        "prompts": sorted(p.name for p in prompts.prompts),
        "config": json.loads(config.contents[0].text),
    }


async def main(transport: str, url: str, key: str, workspace: str, marker: str) -> None:
    if transport == "http":
        async with streamablehttp_client(url, headers={"Authorization": f"Bearer {key}"}) as (read, write, _sid):
            async with ClientSession(read, write) as session:
                report = await exercise(session, workspace, marker)
    else:
        async with sse_client(f"{url}?accessKey={key}") as (read, write):
            async with ClientSession(read, write) as session:
                report = await exercise(session, workspace, marker)
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
