"""`python -m services.stack run`: the whole stack on embedded defaults, until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from services.stack.supervisor import Stack, StackConfig, interrupt_on_stop_signals


def _config_from_env() -> StackConfig:
    data_dir = Path(os.environ.get("ENGRAM_DATA_DIR", ".data"))
    return StackConfig(
        data_dir=data_dir,
        gateway_port=int(os.environ.get("PORT", "57332")),
        recall_ports=[int(p) for p in os.environ.get("RECALL_PORTS", "57333").split(",")],
        ingest_port=int(os.environ.get("INGEST_PORT", "57334")),
        pg_port=int(os.environ.get("ENGRAM_PG_PORT", "57340")),
        redis_port=int(os.environ.get("ENGRAM_REDIS_PORT", "57341")),
        worker_metrics_port=int(os.environ.get("WORKER_METRICS_PORT", "57342")),
        database_url=os.environ.get("DATABASE_URL") or None,
        redis_url=os.environ.get("REDIS_URL") or None,
        redis_enabled=os.environ.get("REDIS_ENABLED", "true").lower() != "false",
    )


def run() -> int:
    stack = Stack(_config_from_env())
    interrupt_on_stop_signals()
    try:
        stack.start()
        print(
            "\nEngram is running.\n"
            f"  MCP URL:     {stack.mcp_url}\n"
            f"  Legacy SSE:  {stack.gateway_url}/sse?accessKey=<master key>\n"
            f"  Health:      {stack.gateway_url}/health\n"
            f"  Master key:  {stack.master_key}\n"
            f"  Logs:        {stack.log_dir}\n"
            f"  Restarts:    {stack.supervisor_log} (a process that dies is started again, with backoff)\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        # The stack's watchdogs restart whatever dies; this thread only waits for Ctrl-C.
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    finally:
        stack.stop()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m services.stack")
    parser.add_argument("command", choices=["run"])
    parser.parse_args()
    return run()


if __name__ == "__main__":
    raise SystemExit(main())
