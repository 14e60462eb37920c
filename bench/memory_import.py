"""What a large POST /api/v1/memory/import (reference 001) costs in memory: the peak resident
memory the gateway and ingest gain while importing a document of --mib MiB, next to the
document's size. The import is parsed as a stream (services/ingest/memory_import.py): each
process should hold the document about once, not the document plus an object tree of it.

Entries are single sentences of --entry-kb KB (no passages to embed). The embedding model's
runtime grows its buffers to the largest batch it has seen (one batch of 256 texts of 2 KB:
+855 MiB, whatever the document), so a 1 MiB import runs first and the sizes are imported in
turn: the first row may still carry that growth, the later ones show what the document
costs. Measured on 2 shared cores (--mib 4 16 --entry-kb 20): 3.8 MiB +272 MiB (buffers
growing), then 15.2 MiB +22.4 MiB for ingest (1.48x the body: the `data` string once and one
batch) and +30.3 MiB for the gateway (the front door's read of the body).

    python -m bench.memory_import                  # a private stack, 4 then 16 MiB of 2 KB entries
    python -m bench.memory_import --mib 4 16 --entry-kb 20
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid

import httpx
import psutil

from bench.harness import print_table, private_stack

# Entries are these words without a sentence end, so the write embeds one text per entry.
WORDS = ["shard", "replica", "quorum", "lease", "fencing", "token", "epoch", "leader", "follower", "snapshot", "compaction"]


def document(mib: int, entry_kb: int = 100) -> bytes:
    entry_chars = entry_kb * 1000
    count = mib * 1024 * 1024 // entry_chars
    entries = [
        {"content": f"entry {i} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(entry_chars // 8)),
         "source": "auto", "tags": ["bench"], "metadata": {"i": i}}
        for i in range(count)
    ]
    doc = {"version": 1, "exportedAt": "2026-01-01T00:00:00Z",
           "namespaces": [{"namespace": {"name": f"bench-{uuid.uuid4().hex[:6]}", "description": ""}, "entries": entries}]}
    return json.dumps({"data": json.dumps(doc)}).encode()


class PeakRss:
    """Samples a process's resident memory every 20 ms until stopped."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.start = process.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def _service(name: str) -> psutil.Process:
    for child in psutil.Process().children(recursive=True):
        if any(f"services.{name}.app" in part for part in child.cmdline()):
            return child
    raise RuntimeError(f"no {name} process under this one")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, nargs="+", default=[4, 16], help="document sizes, imported in turn")
    parser.add_argument("--entry-kb", type=int, default=2)
    args = parser.parse_args()
    with private_stack() as target:
        base = target.mcp_url.removesuffix("/mcp")
        headers = {"X-API-Key": target.key, "content-type": "application/json"}
        httpx.post(f"{base}/api/v1/memory/import", content=document(1, args.entry_kb), timeout=3600, headers=headers).raise_for_status()
        rows = []
        for mib in args.mib:
            body = document(mib, args.entry_kb)
            ingest, gateway = PeakRss(_service("ingest")), PeakRss(_service("gateway"))
            started = time.perf_counter()
            reply = httpx.post(f"{base}/api/v1/memory/import", content=body, timeout=3600, headers=headers)
            seconds = time.perf_counter() - started
            ingest_peak, gateway_peak = ingest.stop(), gateway.stop()
            reply.raise_for_status()
            rows.append([f"{len(body) / 2**20:.1f}", str(reply.json()["entriesImported"]), f"{seconds:.1f}",
                         f"{gateway_peak / 2**20:.1f}", f"{ingest_peak / 2**20:.1f}", f"{ingest_peak / len(body):.2f}"])
            del body
        print_table(
            f"POST /api/v1/memory/import, entries of {args.entry_kb} KB (after a 1 MiB warm-up import)",
            ["body MiB", "entries", "seconds", "gateway peak RSS +MiB", "ingest peak RSS +MiB", "ingest x body"], rows,
        )


if __name__ == "__main__":
    main()
