"""`make bench`: the write-path and read-path benchmarks at 10k on one private stack, then
the consolidation cycle at the same size.

    python -m bench.run_all [--url URL --key KEY] [--n 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time

from bench import ingest_bench, recall_bench
from bench.harness import add_target_arguments, target_from


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args(argv)
    print(f"Engram bench on {platform.node()}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          "(other work on the machine makes these numbers noisy)", flush=True)
    started = time.perf_counter()
    with target_from(args) as target:
        asyncio.run(ingest_bench.run(target, remember_count=200, batch_fragments=2000, client_counts=[2, 4], seed=101))
        asyncio.run(recall_bench.run(target, args.n, args.queries, clients=4, settle=20, seed=7))
    # The consolidation cycle runs in-process on its own embedded Postgres (see its docstring).
    subprocess.run([sys.executable, "-m", "bench.consolidation_bench", "--sizes", str(args.n)], check=True)
    print(f"bench done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
