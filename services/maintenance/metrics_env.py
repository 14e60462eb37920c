"""Prometheus multiprocess mode for the worker: imported first by celery_app, before
anything imports prometheus_client, so every pool process writes its samples to one
directory that the worker's /metrics endpoint aggregates (a forked child's in-memory
counters would otherwise be invisible to the parent's HTTP server).

It touches os.environ directly, not through shared/settings.py, on purpose:
PROMETHEUS_MULTIPROC_DIR is not one of our settings but prometheus_client's own switch, which
that library reads from the environment when it is imported; this module writes it there for
the library and for the pool processes the worker forks."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

# Only a `celery worker` process: beat, scripts and tests that import the app keep the
# ordinary in-process registry (and never hand the variable to processes they start).
if "worker" in sys.argv[1:] and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _dir = tempfile.mkdtemp(prefix="engram-worker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _dir
    _owner = os.getpid()

    def _cleanup() -> None:
        if os.getpid() == _owner:
            shutil.rmtree(_dir, ignore_errors=True)

    atexit.register(_cleanup)
