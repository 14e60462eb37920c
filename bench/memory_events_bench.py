"""Delivery latency of memory:* events to 100 concurrent SSE subscribers (issue 19, item 6).

    python -m bench.memory_events_bench [--subscribers 100] [--writes 40] [--url ... --key ...] [--keep]

One API key (made through the admin API) holds --subscribers open GET /api/v1/memory/events
streams (types=memory:entries-changed) on the gateway. The bench then stores --writes facts in
one bank over MCP, one at a time, and waits until every subscriber has received the write's
memory:entries-changed before the next write. Per (write, subscriber) it records:

  after reply   from the write's reply (the write has committed) to the event at the
                subscriber: what a client that just wrote waits to see it elsewhere; the
                path is commit -> NOTIFY -> ingest's relay -> XADD -> the gateway's XREAD
                -> fan-out -> SSE. Negative when the event beat the reply.
  end to end    from sending the write to the event (the write's own work included).
  from stream   from the XADD (the event id's millisecond) to the event at the
                subscriber: the gateway's share alone (1 ms resolution).

and the write's reply latency, for scale. Same machine, one clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from bench.harness import LATENCY_HEADER, Target, add_target_arguments, call, latency_row, print_table, target_from
from services.stack import client

ADMIN = "/v1/internal/model/nothing"
EVENTS = "/api/v1/memory/events"


@dataclass
class Subscriber:
    """One SSE stream: the arrival time and stream id of each event, in order."""

    arrivals: list[tuple[float, str]] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, http: httpx.AsyncClient, url: str, key: str) -> None:
        params = {"types": "memory:entries-changed"}
        async with http.stream("GET", url, params=params, headers={"X-API-Key": key}) as response:
            response.raise_for_status()
            event_id = None
            async for line in response.aiter_lines():
                if line.startswith(": subscribed"):
                    self.ready.set()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:") and event_id is not None:
                    self.arrivals.append((time.perf_counter(), event_id))
                    self.changed.set()


async def until_count(subscribers: list[Subscriber], count: int) -> None:
    async with asyncio.timeout(60):
        for sub in subscribers:
            while len(sub.arrivals) < count:
                sub.changed.clear()
                await sub.changed.wait()


async def measure(target: Target, subscribers: int, writes: int) -> None:
    base = target.mcp_url.removesuffix("/mcp")
    limits = httpx.Limits(max_connections=subscribers + 10, max_keepalive_connections=subscribers + 10)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as http:
        made = await http.post(f"{base}{ADMIN}/keys", json={"name": f"events-bench-{time.time_ns()}"},
                               headers={"Authorization": f"Bearer {target.key}"})
        made.raise_for_status()
        key = made.json()["raw_key"]
        subs = [Subscriber() for _ in range(subscribers)]
        tasks = [asyncio.create_task(s.run(http, f"{base}{EVENTS}", key)) for s in subs]
        try:
            async with asyncio.timeout(120):
                await asyncio.gather(*(s.ready.wait() for s in subs))
            print(f"{subscribers} subscribers connected", flush=True)
            after_reply: list[float] = []
            end_to_end: list[float] = []
            from_stream: list[float] = []
            replies: list[float] = []
            topic = f"events-bench-{time.time_ns()}"
            async with client.mcp_session(target.mcp_url, key, timeout=120) as session:
                for n in range(writes + 1):  # the first (a new bank) warms the path up
                    sent = time.perf_counter()
                    sent_wall = time.time()
                    await call(session, "remember", {
                        "content": f"Events bench fact {n}: shard {n} of the drill holds {n * 7 % 97} objects.",
                        "topic": topic, "type": "fact",
                    })
                    replied = time.perf_counter()
                    await until_count(subs, n + 1)
                    if n == 0:
                        continue
                    replies.append((replied - sent) * 1000)
                    for sub in subs:
                        arrived, event_id = sub.arrivals[n]
                        after_reply.append((arrived - replied) * 1000)
                        end_to_end.append((arrived - sent) * 1000)
                        arrived_wall = sent_wall + (arrived - sent)
                        from_stream.append(arrived_wall * 1000 - int(event_id.split("-")[0]))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    samples = len(after_reply)
    print_table(
        f"memory:entries-changed to {subscribers} SSE subscribers, {writes} writes ({samples} deliveries)",
        LATENCY_HEADER,
        [
            latency_row("after reply", after_reply, "write committed -> event at subscriber"),
            latency_row("end to end", end_to_end, "write sent -> event at subscriber"),
            latency_row("from stream", from_stream, "XADD -> event at subscriber (1 ms resolution)"),
            latency_row("write reply", replies, "remember over MCP, for scale"),
        ],
    )
    print(json.dumps({"subscribers": subscribers, "writes": writes, "deliveries": samples}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--writes", type=int, default=40)
    args = parser.parse_args()
    with target_from(args) as target:
        asyncio.run(measure(target, args.subscribers, args.writes))


if __name__ == "__main__":
    main()
