"""Resumable export and import for the CLI.

Export pages through GET /export/page (a keyset cursor, oldest first) and appends each page
to the output file as JSON Lines; after a page is written and fsynced, a checkpoint beside it
(`FILE.progress.json`: the cursor, rows and bytes written) is replaced atomically. A run that
stops (Ctrl-C, a crash, a dead server, `--max-pages`) resumes from the last checkpoint: the
file is cut back to the checkpoint's length (a page half written is dropped) and paging goes
on from its cursor. The checkpoint is removed when the export completes.

Import reads JSON Lines (an export) or a JSON array and posts batches to POST /import (ingest's
write path: validation, secret screening, embeddings). After each batch a checkpoint
(`FILE.import-progress.json`: items done, running totals) is replaced atomically; a resumed
run skips the items done. A batch interrupted before its checkpoint is sent again, which the
import keeps idempotent (an exported fragment's id is kept; a second import of it answers
"existing").
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.cli.client import AdminClient, CliError, Exit

CHECKPOINT_VERSION = 1
Progress = Callable[[int, int | None], None]  # (done, total)


def _write_json_atomically(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:
        raise CliError(f"{path} is not a checkpoint this CLI wrote; remove it or pass --restart", Exit.USAGE) from None
    if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
        raise CliError(f"{path} is not a checkpoint this CLI wrote; remove it or pass --restart", Exit.USAGE)
    return doc


@dataclass
class ExportResult:
    rows: int
    pages: int
    complete: bool
    resumed: bool
    file: str


def export_checkpoint(out: Path) -> Path:
    return out.with_name(out.name + ".progress.json")


def export(
    client: AdminClient, out: Path, *, key_id: str | None, topic: str | None, page_size: int, restart: bool,
    max_pages: int | None, progress: Progress,
) -> ExportResult:
    checkpoint = export_checkpoint(out)
    params = {"key_id": key_id, "topic": topic}
    state = None if restart else _read_json(checkpoint)
    if state is not None and state["params"] != params:
        raise CliError(f"{checkpoint} belongs to an export of {state['params']}; pass --restart to start over", Exit.USAGE)
    if state is None and out.exists() and out.stat().st_size > 0 and not restart:
        raise CliError(f"{out} exists and has no checkpoint to resume; pass --restart to overwrite it", Exit.USAGE)
    resumed = state is not None
    if state is None:
        state = {"version": CHECKPOINT_VERSION, "params": params, "cursor": None, "rows": 0, "bytes": 0, "pages": 0}
        out.write_bytes(b"")
        _write_json_atomically(checkpoint, state)
    pages_this_run = 0
    total: int | None = None
    with open(out, "r+b") as f:
        f.truncate(state["bytes"])  # a page written after the last checkpoint is dropped
        f.seek(state["bytes"])
        while True:
            if max_pages is not None and pages_this_run >= max_pages:
                return ExportResult(state["rows"], state["pages"], False, resumed, str(out))
            page = client.get("/export/page", key_id=key_id, topic=topic, after=state["cursor"], limit=page_size,
                              total="true" if total is None else None)
            total = page.get("total", total)
            data = b"".join((json.dumps(item, ensure_ascii=False) + "\n").encode() for item in page["items"])
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            pages_this_run += 1
            state.update(rows=state["rows"] + len(page["items"]), bytes=state["bytes"] + len(data), pages=state["pages"] + 1,
                         cursor=page["nextCursor"] or state["cursor"])
            _write_json_atomically(checkpoint, state)
            progress(state["rows"], total)
            if not page["nextCursor"]:
                break
    checkpoint.unlink(missing_ok=True)
    return ExportResult(state["rows"], state["pages"], True, resumed, str(out))


# -- import -------------------------------------------------------------------------------------

@dataclass
class ImportResult:
    total: int
    done: int
    complete: bool
    resumed: bool
    totals: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)


def import_checkpoint(source: Path) -> Path:
    return source.with_name(source.name + ".import-progress.json")


def _items(source: Path) -> tuple[int, Callable[[], Iterator[Any]]]:
    """How many items the file holds, and an iterator over them (JSON Lines read as a stream;
    a JSON array, or {"fragments": [...]}, read whole)."""
    with open(source, "rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith((b"[", b'{"fragments"')):
        try:
            doc = json.loads(source.read_text(encoding="utf-8"))
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            doc = doc.get("fragments")
        if isinstance(doc, list):
            return len(doc), lambda: iter(doc)

    def lines() -> Iterator[Any]:
        with open(source, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    raise CliError(f"{source}:{number} is not a JSON line", Exit.USAGE) from None

    with open(source, "rb") as f:
        count = sum(1 for line in f if line.strip())
    return count, lines


def import_file(
    client: AdminClient, source: Path, *, key_id: str | None, batch_size: int, restart: bool, max_batches: int | None,
    progress: Progress,
) -> ImportResult:
    checkpoint = import_checkpoint(source)
    size = source.stat().st_size
    state = None if restart else _read_json(checkpoint)
    if state is not None and (state["size"] != size or state["key_id"] != key_id):
        raise CliError(f"{checkpoint} was written for another file or --key-id; pass --restart to start over", Exit.USAGE)
    resumed = state is not None
    if state is None:
        state = {"version": CHECKPOINT_VERSION, "size": size, "key_id": key_id, "done": 0,
                 "totals": {"imported": 0, "existing": 0, "duplicates": 0, "failed": 0}, "failures": []}
    total, items = _items(source)
    progress(state["done"], total)
    batches = 0
    batch: list[Any] = []
    skipped = 0

    def send(chunk: list[Any]) -> None:
        reply = client.json("POST", "/import", params={"key_id": key_id} if key_id else None, json=chunk)
        for name in state["totals"]:
            state["totals"][name] += int(reply.get(name, 0))
        failures = [r | {"index": r.get("index", 0) + state["done"]} for r in reply.get("results", []) if not r.get("success")]
        state["failures"] = (state["failures"] + failures)[-100:]
        state["done"] += len(chunk)
        _write_json_atomically(checkpoint, state)
        progress(state["done"], total)

    already = state["done"]
    for item in items():
        if skipped < already:
            skipped += 1
            continue
        batch.append(item)
        if len(batch) == batch_size:
            if max_batches is not None and batches >= max_batches:
                return ImportResult(total, state["done"], False, resumed, state["totals"], state["failures"])
            send(batch)
            batches += 1
            batch = []
    if batch:
        if max_batches is not None and batches >= max_batches:
            return ImportResult(total, state["done"], False, resumed, state["totals"], state["failures"])
        send(batch)
    checkpoint.unlink(missing_ok=True)
    return ImportResult(total, state["done"], True, resumed, state["totals"], state["failures"])
