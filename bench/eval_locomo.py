"""`make eval`: the team's LoCoMo retrieval eval against a private stack.

Runs ../shared/eval/locomo_eval.py (relative to the repo root) as a subprocess, as any
client would; nothing is imported from ../shared. Extra arguments go to the eval, e.g.
`python -m bench.eval_locomo --conversations conv-26`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.harness import add_target_arguments, target_from

REPO_ROOT = Path(__file__).resolve().parent.parent
EVAL_SCRIPT = REPO_ROOT.parent / "shared" / "eval" / "locomo_eval.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    args, passthrough = parser.parse_known_args(argv)
    if not EVAL_SCRIPT.is_file():
        print(f"eval script not found at {EVAL_SCRIPT}", file=sys.stderr)
        return 2
    with target_from(args) as target:
        argv_eval = [sys.executable, str(EVAL_SCRIPT), "--url", target.mcp_url, "--key", target.key, "--cleanup", *passthrough]
        # Output streams straight through; the eval's last line is its headline.
        return subprocess.run(argv_eval, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
