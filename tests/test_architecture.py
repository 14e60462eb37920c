"""Each shared piece exists once (issue 16, item 4): SQL only in shared/repositories/, settings
only in shared/settings.py, tenant scope written by one helper, jobs sent through shared/jobs.py,
the internal RPC's service-token header named once. Read from the source, since what is
checked is where code lives, not what it does."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
QUERY_METHODS = {"execute", "executemany", "fetch", "fetchval", "fetchrow", "cursor"}
# Outside the repositories on purpose: the migration runner applies schema files, and the
# pool's own health probe is `SELECT 1`.
SQL_ELSEWHERE = {"shared/db.py", "shared/schema/migrate.py"}


def sources() -> Iterator[tuple[str, str]]:
    for top in ("services", "shared"):
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def _literal(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return ""


def test_sql_is_written_only_in_repositories() -> None:
    found = []
    for name, text in sources():
        if name.startswith("shared/repositories/") or name in SQL_ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in QUERY_METHODS
                    and node.args and SQL.match(_literal(node.args[0]))):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_settings_classes_live_in_shared_settings() -> None:
    found = []
    for name, text in sources():
        if name == "shared/settings.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                if any(b.endswith("Settings") for b in bases):
                    found.append(f"{name}:{node.name}")
    assert found == []


def test_tenant_scope_is_written_by_one_helper() -> None:
    """A key_id filter written by hand (IS NULL, IS NOT DISTINCT FROM, = ANY) outside
    shared.domain.principal.scope_clause / same_tenant is how tenants leak into each other."""
    by_hand = re.compile(r"key_id\s+(IS\s+NOT\s+DISTINCT\s+FROM|IS\s+NULL)|key_id\s*=\s*ANY\s*\(", re.IGNORECASE)
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        for name, text in sources() if name != "shared/domain/principal.py"
        for m in by_hand.finditer(text)
    ]
    assert found == []


def test_jobs_are_sent_only_through_shared_jobs() -> None:
    send = re.compile(r"\.(apply_async|send_task|delay)\(")
    found = [
        name for name, text in sources()
        if name != "shared/jobs.py" and send.search(text) and "celery" in text.lower()
    ]
    assert found == []


def test_the_service_token_header_is_named_once() -> None:
    found = [name for name, text in sources() if "x-engram-service-token" in text]
    assert found == ["services/common/rpc.py"]
