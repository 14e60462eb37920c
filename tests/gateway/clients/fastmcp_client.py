"""Run by fastmcp's own venv (make test-clients): connect, list, call, print JSON.

usage: fastmcp_client.py (http|sse) URL KEY WORKSPACE MARKER
"""

from __future__ import annotations

import asyncio
import json
import sys

from fastmcp import Client
from fastmcp.client.transports import SSETransport, StreamableHttpTransport


async def main(transport: str, url: str, key: str, workspace: str, marker: str) -> None:
    if transport == "http":
        target = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {key}"})
    else:
        target = SSETransport(f"{url}?accessKey={key}")
    async with Client(target) as client:
        tools = await client.list_tools()
        stored = await client.call_tool(
            "remember",
            {"content": f"The fastmcp client stored {marker} through the gateway.", "topic": "clients", "type": "fact", "workspace": workspace},
        )
        found = await client.call_tool("recall", {"keywords": [marker], "workspace": workspace})
        prompts = await client.list_prompts()
        config = await client.read_resource("memory://config")
    print(json.dumps({
        "tools": sorted(t.name for t in tools),
        "stored": stored.structured_content,
        "found": found.structured_content,
        "prompts": sorted(p.name for p in prompts),
        "config": json.loads(config[0].text),
    }))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
