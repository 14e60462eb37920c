"""Loading a corpus with batch_remember from several concurrent MCP clients."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.corpus import Memory
from bench.harness import Target, call, mcp_session

# seed: batch_remember takes at most 200 fragments per call.
BATCH = 200


def run_namespace(label: str) -> str:
    """A workspace prefix unique to one run, so reruns against a shared stack neither
    collide with earlier data nor get deduplicated (content_hash is per workspace)."""
    return f"bench-{label}-{uuid.uuid4().hex[:6]}"


def scoped(fragment: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**fragment, "workspace": f"{namespace}-{fragment['workspace']}"}


@dataclass
class LoadResult:
    ids: list[str | None]
    seconds: float
    batch_ms: list[float] = field(default_factory=list)
    failed: int = 0
    duplicates: int = 0

    @property
    def stored(self) -> int:
        return sum(1 for i in self.ids if i) - self.duplicates

    @property
    def rate(self) -> float:
        return len(self.ids) / self.seconds if self.seconds else float("nan")


async def load(target: Target, memories: list[Memory], namespace: str, clients: int, batch: int = BATCH) -> LoadResult:
    """Store every memory; ids[i] answers memories[i]. Clients pull the next batch from a
    shared cursor, so a slow batch does not idle the others."""
    fragments = [scoped(m.fragment, namespace) for m in memories]
    batches = [(start, fragments[start:start + batch]) for start in range(0, len(fragments), batch)]
    result = LoadResult(ids=[None] * len(fragments), seconds=0.0)
    cursor = iter(batches)

    async def client() -> None:
        async with mcp_session(target) as session:
            for start, items in cursor:
                began = time.perf_counter()
                body = await call(session, "batch_remember", {"fragments": items})
                result.batch_ms.append((time.perf_counter() - began) * 1000)
                for item in body["results"]:
                    if item.get("success"):
                        result.ids[start + item["index"]] = item["id"]
                        result.duplicates += bool(item.get("duplicate"))
                    else:
                        result.failed += 1

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    result.seconds = time.perf_counter() - began
    return result
