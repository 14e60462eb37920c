"""The remember profile's logical paths (reference 003): `path` ties a memory to an owner
project or a permanent namespace, and maps onto Engram's workspace and topic.

    projects/<project>[/<rest>]  -> workspace <project> (the owner project), topic <rest>
                                    ("general" when the path names only the project)
    <namespace>[/<rest>]          -> the key's default workspace, topic the whole path

A path is 1-8 segments of letters, digits and `._-` (any script), each 1-64 characters,
200 at most in all; segments starting with `.` or `_` and the roots `identity`, `accounts`,
`devices` are reserved (an identity is the server's to say, never a caller's). `teams/...`
names a team boundary Engram does not model (sharing is by key groups), so it is refused."""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.domain.fragment import MAX_LABEL_CHARS

MAX_PATH_CHARS = MAX_LABEL_CHARS  # 200: a topic is at most that long
MAX_SEGMENTS = 8
MAX_SEGMENT_CHARS = 64
PROJECTS_ROOT = "projects"
TEAMS_ROOT = "teams"
GENERAL_TOPIC = "general"
RESERVED_ROOTS = frozenset({"identity", "accounts", "devices"})
_SEGMENT = re.compile(r"^[\w.-]+$")

# The last segment names what kind of memory it is (003: facts, preferences, decisions,
# verified handoff notes); anything else is a fact. Handoff notes are episodes, which Engram
# stores whole (other types are cut at 300 characters).
_TYPE_BY_LEAF = {
    "decisions": "decision", "decision": "decision",
    "preferences": "preference", "preference": "preference",
    "procedures": "procedure", "procedure": "procedure", "runbooks": "procedure",
    "errors": "error", "incidents": "error",
    "handoffs": "episode", "handoff": "episode", "notes": "episode",
}


class PathRefused(ValueError):
    """Not a path this profile stores under; `kind` is "validation" or "safety"."""

    def __init__(self, message: str, kind: str = "validation") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class LogicalPath:
    path: str  # normalized: segments joined by "/", no empty segment
    project: str | None  # the owner project, for projects/<name>/...
    topic: str
    fragment_type: str

    @property
    def workspace(self) -> str | None:
        """The project's workspace; None for a namespace (the key's default applies)."""
        return self.project


def parse(raw: str) -> LogicalPath:
    text = raw.strip().strip("/")
    if not text:
        raise PathRefused("path: must not be empty")
    if len(text) > MAX_PATH_CHARS:
        raise PathRefused(f"path: at most {MAX_PATH_CHARS} characters")
    segments = [s.strip() for s in text.split("/")]
    if len(segments) > MAX_SEGMENTS:
        raise PathRefused(f"path: at most {MAX_SEGMENTS} segments")
    for segment in segments:
        if not segment:
            raise PathRefused("path: empty segment (//)")
        if len(segment) > MAX_SEGMENT_CHARS or not _SEGMENT.match(segment):
            shown = segment[:MAX_SEGMENT_CHARS]
            raise PathRefused(f"path: segment {shown!r} must be 1-{MAX_SEGMENT_CHARS} letters, digits, '.', '_' or '-'")
        if segment[0] in "._":
            raise PathRefused(f"path: segment {segment!r} is reserved", kind="safety")
    root = segments[0].lower()
    if root in RESERVED_ROOTS:
        raise PathRefused(f"path: {segments[0]}/ is reserved identity metadata", kind="safety")
    if root == TEAMS_ROOT:
        raise PathRefused("path: team paths are not served (Engram shares memory through key groups)", kind="authorization")
    leaf = segments[-1].lower()
    fragment_type = _TYPE_BY_LEAF.get(leaf, "fact")
    normalized = "/".join(segments)
    if root == PROJECTS_ROOT:
        if len(segments) < 2:
            raise PathRefused("path: projects/<project>[/...] names a project")
        rest = "/".join(segments[2:])
        return LogicalPath(normalized, segments[1], rest or GENERAL_TOPIC, fragment_type)
    return LogicalPath(normalized, None, normalized, fragment_type)


def path_of(workspace: str | None, topic: str, default_workspace: str | None) -> str:
    """The logical path a stored memory reads back as (the inverse of parse)."""
    if workspace is None or workspace == default_workspace:
        return topic
    if topic == GENERAL_TOPIC:
        return f"{PROJECTS_ROOT}/{workspace}"
    return f"{PROJECTS_ROOT}/{workspace}/{topic}"
