"""Admin REST: the services' log files (seed: /logs/files, /logs/read?file=&tail=&level=&search=,
/logs/stats; master key only).

The files are those in LOG_DIR (`make run` and the test stack write `gateway.log`,
`recall-0.log`, `ingest.log`, `worker.log`, `beat.log`, `supervisor.log` there). A deployment
that logs to stdout only (no LOG_DIR) gets an answer saying so, not an error.

`file` names a file directly in LOG_DIR and nothing else: a plain name (letters, digits, `.`,
`_`, `-`; no separator, no leading dot), ending in `.log` (or a rotated `.log.N`), that is a
regular file and not a symlink, opened with O_NOFOLLOW, and whose real path's folder is
LOG_DIR's real path. `../x`, absolute paths, encoded separators (decoded before this check),
NUL (refused by require_master) and links pointing out are all refused before any read.

Reading is bounded: at most READ_WINDOW_BYTES from the end of a file are parsed, so a huge
file costs the same as a small one. Lines are parsed as Engram's text format
(`2026-05-01 12:00:00,123 INFO name [...] message`), Celery's (`[2026-05-01 12:00:00,123:
INFO/MainProcess] message`), uvicorn's (`INFO:     message`) or JSON (LOG_FORMAT=json: `level`
/ `levelname`, `timestamp` / `asctime` / `time`, `message` / `msg`); a line matching none
(a traceback) continues the entry before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Depends, HTTPException, Request

from services.gateway.admin.admin_auth import require_master
from services.gateway.core.state import gateway_state

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])

# seed: tail 1..1000, default 200.
TAIL_DEFAULT = 200
TAIL_MAX = 1000
# The end of a file /logs/read parses (and filters): ~20k typical lines.
READ_WINDOW_BYTES = 4 * 1024 * 1024
# The end of each file /logs/stats counts levels in.
STATS_WINDOW_BYTES = 1024 * 1024
RECENT_ERRORS = 10
CHUNK = 64 * 1024

FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.log(\.[0-9]{1,3})?$")
_STAMP = r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)"
_LEVEL = r"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
TEXT_LINE = re.compile(rf"^{_STAMP}\s+{_LEVEL}\s+(.*)$", re.IGNORECASE)
CELERY_LINE = re.compile(rf"^\[{_STAMP}:\s*{_LEVEL}/[^\]]*\]\s?(.*)$", re.IGNORECASE)
BARE_LINE = re.compile(rf"^{_LEVEL}:\s+(.*)$", re.IGNORECASE)
LEVELS = ("debug", "info", "warning", "error", "critical")
ALIASES = {"warn": "warning", "fatal": "critical"}
NOT_CONFIGURED = "LOG_DIR is not set: this deployment logs to stdout only (read them where stdout goes, e.g. kubectl logs)"


@dataclass
class Entry:
    timestamp: str | None
    level: str | None
    message: str

    def wire(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "level": self.level, "message": self.message}


def _level(text: str) -> str:
    lowered = text.lower()
    return ALIASES.get(lowered, lowered)


def parse_line(line: str) -> Entry | None:
    """An entry's first line, or None for a continuation line."""
    for pattern in (TEXT_LINE, CELERY_LINE):
        m = pattern.match(line)
        if m:
            return Entry(m.group(1), _level(m.group(2)), m.group(3))
    m = BARE_LINE.match(line)
    if m:
        return Entry(None, _level(m.group(1)), m.group(2))
    if line.startswith("{"):
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if isinstance(doc, dict) and any(k in doc for k in ("level", "levelname")):
            level = str(doc.get("level") or doc.get("levelname") or "")
            stamp = doc.get("timestamp") or doc.get("asctime") or doc.get("time")
            message = doc.get("message") or doc.get("msg") or ""
            return Entry(str(stamp) if stamp is not None else None, _level(level) if level else None, str(message))
    return None


def parse(text: str) -> list[Entry]:
    entries: list[Entry] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = parse_line(line)
        if entry is not None:
            entries.append(entry)
        elif entries:
            entries[-1].message += "\n" + line
        else:  # the window began inside an entry, or a line of no known shape
            entries.append(Entry(None, None, line))
    return entries


def _log_dir(request: Request) -> Path | None:
    configured = gateway_state(request).settings.log_dir
    if not configured:
        return None
    return Path(os.path.realpath(configured))


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        return [e for e in it if FILE_NAME.match(e.name) and e.is_file(follow_symlinks=False)]


def _open_log(folder: Path, name: str) -> int:
    """A file descriptor of `name` in `folder`, or HTTPException: never a path outside it."""
    if not FILE_NAME.match(name):
        raise HTTPException(status_code=400, detail="file must be the plain name of a .log file in the log folder")
    path = folder / name
    if os.path.realpath(path) != str(path) or Path(os.path.realpath(path)).parent != folder:
        raise HTTPException(status_code=403, detail="file is not a regular file of the log folder")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise HTTPException(status_code=404, detail="File not found") from None
    except OSError:  # ELOOP: a symlink; anything else unreadable
        raise HTTPException(status_code=403, detail="file is not a regular file of the log folder") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HTTPException(status_code=403, detail="file is not a regular file of the log folder")
    return fd


def _tail_text(fd: int, window: int) -> str:
    """The last `window` bytes of the file (from a line start when the file is longer)."""
    size = os.fstat(fd).st_size
    start = max(0, size - window)
    os.lseek(fd, start, os.SEEK_SET)
    chunks = []
    remaining = size - start
    while remaining > 0:
        chunk = os.read(fd, min(CHUNK, remaining))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    data = b"".join(chunks)
    if start > 0:
        data = data.partition(b"\n")[2]  # drop the partial first line
    return data.decode("utf-8", errors="replace")


def _read(folder: Path, name: str, window: int) -> str:
    fd = _open_log(folder, name)
    try:
        return _tail_text(fd, window)
    finally:
        os.close(fd)


def _disabled(**empty: Any) -> dict[str, Any]:
    return {"enabled": False, "message": NOT_CONFIGURED, "logDir": None, **empty}


def _file_entry(e: os.DirEntry[str]) -> dict[str, Any]:
    info = e.stat(follow_symlinks=False)
    modified = datetime.fromtimestamp(info.st_mtime, UTC)
    return {
        "name": e.name, "type": e.name.split(".log")[0], "date": modified.date().isoformat(), "size": info.st_size,
        "modifiedAt": modified.isoformat(),
    }


@router.get("/logs/files")
async def log_files(request: Request) -> dict[str, Any]:
    folder = _log_dir(request)
    if folder is None:
        return _disabled(files=[], totalSize=0)
    if not folder.is_dir():
        return {"enabled": True, "logDir": str(folder), "files": [], "totalSize": 0, "message": "the log folder does not exist yet"}
    entries = await anyio.to_thread.run_sync(lambda: [_file_entry(e) for e in _listing(folder)])
    entries.sort(key=lambda f: (f["modifiedAt"], f["name"]), reverse=True)
    return {"enabled": True, "logDir": str(folder), "files": entries, "totalSize": sum(f["size"] for f in entries)}


@router.get("/logs/read")
async def read_log(
    request: Request, file: str | None = None, tail: int = TAIL_DEFAULT, level: str | None = None, search: str | None = None,
) -> dict[str, Any]:
    """The last `tail` entries of `file` that have `level` and contain `search` (case-insensitive),
    oldest first. total: entries in the window read; filtered: how many of them matched."""
    folder = _log_dir(request)
    if folder is None:
        return _disabled(file=file, lines=[], total=0, filtered=0)
    if not file:
        raise HTTPException(status_code=400, detail="file parameter is required")
    wanted_level = _level(level) if level else None
    if wanted_level is not None and wanted_level not in LEVELS:
        raise HTTPException(status_code=400, detail=f"level must be one of {', '.join(LEVELS)} (or warn)")
    tail = max(1, min(tail, TAIL_MAX))
    text = await anyio.to_thread.run_sync(_read, folder, file, READ_WINDOW_BYTES)
    entries = parse(text)
    matched = [
        e for e in entries
        if (wanted_level is None or e.level == wanted_level) and (not search or search.lower() in e.message.lower())
    ]
    return {
        "enabled": True, "file": file, "lines": [e.wire() for e in matched[-tail:]], "total": len(entries),
        "filtered": len(matched),
    }


def _stats(folder: Path) -> dict[str, Any]:
    files = _listing(folder)
    today = datetime.now().astimezone().date().isoformat()  # the services stamp local time
    counts = dict.fromkeys(LEVELS, 0)
    errors: list[dict[str, Any]] = []
    sizes = []
    for e in files:
        sizes.append((e.stat(follow_symlinks=False).st_mtime, e.name, e.stat(follow_symlinks=False).st_size))
        try:
            text = _read(folder, e.name, STATS_WINDOW_BYTES)
        except HTTPException:
            continue  # replaced by a link or removed since the listing
        for entry in parse(text):
            if entry.timestamp is None or not entry.timestamp.startswith(today) or entry.level not in counts:
                continue
            counts[entry.level] += 1
            if entry.level in ("error", "critical"):
                errors.append({"timestamp": entry.timestamp, "file": e.name, "message": entry.message[:2000]})
    errors.sort(key=lambda x: x["timestamp"])
    sizes.sort()
    usage = shutil.disk_usage(folder)
    return {
        "enabled": True,
        "logDir": str(folder),
        "today": {**counts, "warn": counts["warning"]},
        "recentErrors": errors[-RECENT_ERRORS:],
        "fileCount": len(files),
        "totalSizeBytes": sum(s for _, _, s in sizes),
        "oldestFile": sizes[0][1] if sizes else None,
        "newestFile": sizes[-1][1] if sizes else None,
        "disk": {"total": usage.total, "used": usage.used, "free": usage.free,
                 "percent": round(usage.used / usage.total * 100, 1) if usage.total else None},
    }


@router.get("/logs/stats")
async def log_stats(request: Request) -> dict[str, Any]:
    """seed: counts per level (today's entries, in the last STATS_WINDOW_BYTES of each file), recent
    errors, disk usage."""
    folder = _log_dir(request)
    if folder is None:
        return _disabled(today=dict.fromkeys(LEVELS, 0), recentErrors=[], fileCount=0, totalSizeBytes=0, oldestFile=None,
                         newestFile=None, disk=None)
    if not folder.is_dir():
        return {"enabled": True, "logDir": str(folder), "message": "the log folder does not exist yet", "today": dict.fromkeys(LEVELS, 0),
                "recentErrors": [], "fileCount": 0, "totalSizeBytes": 0, "oldestFile": None, "newestFile": None, "disk": None}
    return await anyio.to_thread.run_sync(_stats, folder)
