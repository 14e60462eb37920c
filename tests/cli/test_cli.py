"""The `engram` CLI, run as a subprocess (the installed [project.scripts] entry point) against
the real test stack: keys, stats, resumable export / import, consolidate, fsck, sessions, and
exit codes that mean something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Stack, call, create_api_key, mcp_session, unique

ENGRAM = Path(sys.executable).parent / "engram"
ADMIN = "/v1/internal/model/nothing"


def engram(stack: Stack, *args: str, key: str | None = "master", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "MEMENTO_"))}
    env |= {"ENGRAM_URL": stack.gateway_url, "COLUMNS": "200"}
    if key is not None:
        env["ENGRAM_MASTER_KEY"] = stack.master_key if key == "master" else key
    return subprocess.run([str(ENGRAM), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


async def remember_all(stack: Stack, key: str, topic: str, texts: list[str]) -> list[str]:
    async with mcp_session(stack.mcp_url, key) as s:
        reply = await call(s, "batch_remember", {"fragments": [{"content": t, "topic": topic, "type": "fact"} for t in texts]})
    return [r["id"] for r in reply["results"]]


async def test_keys_lifecycle_and_exit_codes(stack: Stack) -> None:
    name = unique("cli-key")
    created = as_json(engram(stack, "--json", "keys", "create", name, "--permissions", "read", "--mode", "recall-only",
                             "--daily-limit", "100"))
    assert created["raw_key"].startswith("mmcp_") and created["default_mode"] == "recall-only" and created["daily_limit"] == 100
    listed = {k["id"]: k for k in as_json(engram(stack, "--json", "keys", "list"))}
    assert listed[created["id"]]["name"] == name and "raw_key" not in listed[created["id"]]
    human = engram(stack, "keys", "list")
    assert human.returncode == 0 and name in human.stdout
    assert as_json(engram(stack, "--json", "keys", "deactivate", created["id"]))["status"] == "inactive"
    assert as_json(engram(stack, "--json", "keys", "activate", created["id"]))["status"] == "active"
    assert engram(stack, "keys", "delete", created["id"], "--yes").returncode == 0
    gone = engram(stack, "--json", "keys", "delete", created["id"], "--yes")
    assert gone.returncode == 4 and json.loads(gone.stderr)["status"] == 404

    # 3: no key, a wrong key, a key that is not the master key
    assert engram(stack, "keys", "list", key=None).returncode == 3
    assert engram(stack, "keys", "list", key="not-the-key").returncode == 3
    raw, _ = await create_api_key(stack.database_url, permissions=["read", "write", "admin"])
    assert engram(stack, "keys", "list", key=raw).returncode == 3
    # 2: a bad command line, or arguments the server refuses
    assert engram(stack, "keys", "list", "--no-such-flag").returncode == 2
    assert engram(stack, "keys", "create", unique("k"), "--permissions", "root").returncode == 2
    # 5: nobody answers
    dead = subprocess.run([str(ENGRAM), "--url", "http://127.0.0.1:9", "--key", "x", "stats"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert dead.returncode == 5 and "cannot reach" in dead.stderr


def test_stats(stack: Stack) -> None:
    data = as_json(engram(stack, "--json", "stats"))
    assert {"fragments", "apiCallsToday", "system", "searchMetrics", "observability", "queues", "healthFlags"} <= set(data)
    human = engram(stack, "stats")
    assert human.returncode == 0 and "fragments" in human.stdout and str(data["activeKeys"]) in human.stdout


async def test_export_resumes_from_its_last_complete_page(stack: Stack, tmp_path: Path) -> None:
    key, key_id = await create_api_key(stack.database_url)
    topic = unique("export")
    ids = await remember_all(stack, key, topic, [f"Export resume fact number {i}: the queue drains nightly." for i in range(7)])
    out = tmp_path / "export.jsonl"
    checkpoint = tmp_path / "export.jsonl.progress.json"

    first = as_json(engram(stack, "--json", "export", str(out), "--key-id", key_id, "--page-size", "2", "--max-pages", "2"))
    assert first == {"rows": 4, "pages": 2, "complete": False, "resumed": False, "file": str(out)}
    assert checkpoint.exists() and len(out.read_text().splitlines()) == 4
    # a crash while the third page was being written leaves a torn line after the checkpoint
    with open(out, "a") as f:
        f.write('{"id": "frag-torn", "content": "half a pa')
    done = as_json(engram(stack, "--json", "export", str(out), "--key-id", key_id, "--page-size", "2"))
    assert done["complete"] and done["resumed"] and done["rows"] == 7 and not checkpoint.exists()
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    # each once, the torn line gone (one batch shares created_at: the order is the export's, below)
    assert sorted(row["id"] for row in exported) == sorted(ids)
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, headers={"Authorization": f"Bearer {stack.master_key}"}) as http:
        streamed = [json.loads(line) for line in (await http.get("/export", params={"key_id": key_id})).text.splitlines()]
    assert exported == streamed  # the same rows as the streamed export
    again = engram(stack, "export", str(out), "--key-id", key_id)
    assert again.returncode == 2 and "--restart" in again.stderr
    assert as_json(engram(stack, "--json", "export", str(out), "--key-id", key_id, "--restart"))["rows"] == 7
    assert engram(stack, "export", str(tmp_path / "x.jsonl"), "--key-id", "no-such-key").returncode == 4


async def test_import_in_batches_resumes_and_reports_failures(stack: Stack, tmp_path: Path) -> None:
    _, key_id = await create_api_key(stack.database_url)
    topic = unique("import")
    source = tmp_path / "new.jsonl"
    source.write_text("".join(
        json.dumps({"content": f"Imported fact {i}: backups run at {i} o'clock.", "topic": topic, "type": "fact"}) + "\n" for i in range(7)))

    partial = as_json(engram(stack, "--json", "import", str(source), "--key-id", key_id, "--batch-size", "3", "--max-batches", "1"))
    assert partial["done"] == 3 and not partial["complete"] and partial["totals"]["imported"] == 3
    assert (tmp_path / "new.jsonl.import-progress.json").exists()
    finished = as_json(engram(stack, "--json", "import", str(source), "--key-id", key_id, "--batch-size", "3"))
    assert finished["complete"] and finished["resumed"] and finished["done"] == 7 and finished["totals"]["imported"] == 7
    async with httpx.AsyncClient(base_url=stack.gateway_url + ADMIN, headers={"Authorization": f"Bearer {stack.master_key}"}) as http:
        page = (await http.get("/memory/fragments", params={"key_id": key_id, "topic": topic, "limit": 100})).json()
    assert page["total"] == 7 and len({i["preview"] for i in page["items"]}) == 7  # no batch imported twice

    # an export re-imported into its own tenant is idempotent
    exported = tmp_path / "roundtrip.jsonl"
    assert engram(stack, "export", str(exported), "--key-id", key_id, "--topic", topic).returncode == 0
    replay = as_json(engram(stack, "--json", "import", str(exported), "--key-id", key_id))
    assert replay["totals"]["existing"] == 7 and replay["totals"]["imported"] == 0

    # items the write path refuses: reported, exit 6
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"content": "A fine fact about the staging cluster rollout.", "topic": topic, "type": "fact"},
                               {"content": "x", "topic": topic, "type": "no-such-type"}]))
    refused = engram(stack, "--json", "import", str(bad), "--key-id", key_id)
    assert refused.returncode == 6, refused.stderr
    report = json.loads(refused.stdout)
    assert report["totals"]["failed"] == 1 and report["totals"]["imported"] == 1 and report["failures"][0]["index"] == 1


def test_consolidate_waits_and_shows_its_stages(stack: Stack) -> None:
    result = engram(stack, "consolidate", "--stage", "ttl_tiers", "--stage", "importance_decay")
    assert result.returncode == 0, result.stderr
    assert "ttl_tiers" in result.stdout and "importance_decay" in result.stdout and "succeeded" in result.stdout
    run = as_json(engram(stack, "--json", "consolidate", "--stage", "anomalies"))
    assert run["status"] == "succeeded" and list(run["result"]["stages"]) == ["anomalies"]
    # the run row carried the stage progress the CLI showed
    assert run["progress"]["stage"] == "anomalies" and run["progress"]["total"] == 1
    queued = as_json(engram(stack, "--json", "consolidate", "--no-wait", "--stage", "ttl_tiers"))
    assert queued["runId"] > run["runId"] and queued["status"] == "queued"
    assert engram(stack, "consolidate", "--stage", "no_such_stage").returncode == 2


async def test_fsck_runs_and_lists_issues(stack: Stack) -> None:
    key, key_id = await create_api_key(stack.database_url)
    await remember_all(stack, key, unique("fsck"), ["The nightly backup job writes to the east bucket."])
    run = as_json(engram(stack, "--json", "fsck", "--scope", "key", "--key-id", key_id))
    assert run["status"] == "succeeded" and run["tenant"] == f"key:{key_id}" and isinstance(run["issues"], list)
    assert run["progress"]["phase"] == "done"
    assert engram(stack, "fsck", "--scope", "key").returncode == 1  # keyId missing: the server's 400


async def test_session_list_show_rotate_end(stack: Stack) -> None:
    raw, key_id = await create_api_key(stack.database_url)
    async with mcp_session(stack.mcp_url, raw) as s:
        await call(s, "memory_stats", {})
        sessions = as_json(engram(stack, "--json", "session", "list"))["sessions"]
        session_id = next(x["sessionId"] for x in sessions if x["keyId"] == key_id)
        assert as_json(engram(stack, "--json", "session", "show", session_id))["keyId"] == key_id

        # seed: only the session's own key may rotate it (403 -> exit 3 for the master key here)
        assert engram(stack, "session", "rotate", session_id).returncode == 3
        rotated = as_json(engram(stack, "--json", "session", "rotate", session_id, "--reason", "suspected_leak", key=raw))
        assert rotated["ok"] and rotated["oldSessionId"] == session_id and rotated["newSessionId"] != session_id
        assert rotated["reason"] == "suspected_leak"
        await call(s, "memory_stats", {})  # the client's connection is not disturbed

        assert as_json(engram(stack, "--json", "session", "end", rotated["newSessionId"]))["ok"]
        with pytest.raises(Exception):
            await call(s, "memory_stats", {})
    assert engram(stack, "session", "show", unique("none")).returncode == 4
