"""Secret screening: the detector against a corpus of both kinds, and every free-text field
of every write refused (or redacted) through the real stack over MCP and the admin API."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.domain.secrets import SecretFound, find_secrets, redact, screen, secret_kinds
from tests.ingest.helpers import db, fragment, import_, rpc_error
from tests.ingest.secret_corpus import PROSE, SECRETS
from tests.support import Stack, call, mcp_session, new_stack_config, unique

# ------------------------------------------------------------------ the corpus (no stack)


def test_the_corpus_is_broad() -> None:
    assert len(SECRETS) >= 40 and len(PROSE) >= 60
    assert len({kind for _, kind in SECRETS}) >= 25  # distinct shapes, not 40 passwords


@pytest.mark.parametrize(("text", "kind"), SECRETS, ids=[f"{k}-{i}" for i, (_, k) in enumerate(SECRETS)])
def test_every_secret_is_caught_with_its_kind(text: str, kind: str) -> None:
    findings = find_secrets(text)
    assert kind in secret_kinds(findings), (text, findings)
    # Redaction leaves no credential behind: the redacted text is clean.
    assert find_secrets(redact(text, findings)) == [], redact(text, findings)


def test_no_prose_line_is_flagged() -> None:
    # The false-positive rate over the prose corpus is 0: config talk (max_token=4096,
    # first_pass=done, pass=three), hashes, UUIDs, versions, paths, URLs, Korean.
    flagged = {line: secret_kinds(find_secrets(line)) for line in PROSE if find_secrets(line)}
    assert flagged == {}


def test_issue_shapes_that_were_stored_or_refused_wrongly() -> None:
    # issue 15 finding 6, one by one.
    missed = [
        "PGPASSWORD=Pg_s3cret_9 psql -h db",
        "AccountName=x;AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6QUJDREVGR0g=;",
        "mysql -u root -pS3cr3tPw app",
        "curl -u admin:Adm1nPassw0rd https://x",
        "machine api.example.com login ops password 5f0c2e9a-heroku-token",
        "MTA4NzY1NDMyMTA5ODc2NTQzMg.GhT5kL.aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5z",
        "5123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw9",
        "dop_v1_4b6c1e2f3a5d7c9e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a",
        "hvs.CAESIJlKbJ3Xq0k2mZ8nYtR5vW7uP4sQ1oN6aE9dF3gH2jK0",
        '"private_key_id": "8f3c2a1b9d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a"',
    ]
    assert [text for text in missed if not find_secrets(text)] == []
    assert [text for text in ("max_token=4096", "first_pass=done", "pass=three") if find_secrets(text)] == []


def test_redaction_keeps_prose_and_drops_the_value() -> None:
    text = "Deploy with password=hunter2 and token ghp_1234567890abcdefghijklmnopqrstuvwxyzAB today."
    out = redact(text)
    assert out == "Deploy with password=[REDACTED:password_assignment] and token [REDACTED:github_token] today."


def test_screen_reject_names_the_kind_never_the_value() -> None:
    with pytest.raises(SecretFound) as err:
        screen("content", "the key is AKIAIOSFODNN7EXAMPLE", "reject")
    assert err.value.code == -32602 and err.value.data == {"field": "content", "secretKinds": ["aws_access_key"]}
    assert "aws_access_key" in err.value.message and "AKIA" not in err.value.message
    kept = screen("content", "the key is AKIAIOSFODNN7EXAMPLE", "redact")
    assert kept.text == "the key is [REDACTED:aws_access_key]" and kept.redacted == ["aws_access_key"]


# ------------------------------------------------------------------ through the stack


def aws_key() -> str:
    """An AWS access key id no other test wrote, so finding it in the database means a leak."""
    return "AKIA" + "".join(random.choices(string.ascii_uppercase + string.digits, k=16))


async def tables_holding(database_url: str, needles: list[str]) -> list[str]:
    """Every table of the schema with a row whose text contains one of the needles."""
    patterns = [f"%{n}%" for n in needles]
    async with db(database_url) as conn:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'agent_memory' AND table_type = 'BASE TABLE'"
        )
        found = []
        for row in tables:
            name = row["table_name"]
            if await conn.fetchval(f'SELECT EXISTS (SELECT 1 FROM "{name}" t WHERE t::text LIKE ANY($1::text[]))', patterns):
                found.append(name)
    return found


def refused_for(err: Any, field: str) -> bool:
    return (err.code == -32602 and err.data == {"field": field, "secretKinds": ["aws_access_key"]}
            and "AKIA" not in err.message)


REMEMBER = {"content": "The uploader runs every night and pushes the logs.", "topic": "ops", "type": "fact"}
# Every free-text field of remember (shared/contract/write.py RememberArgs).
REMEMBER_TEXT_FIELDS = ("phase", "caseId", "agentId", "sessionId", "workspace", "topic", "source", "goal",
                        "outcome", "contextSummary", "idempotencyKey")


async def test_a_secret_in_any_field_of_any_write_is_refused_and_nothing_is_stored(stack: Stack, mcp_url: str, master_key: str) -> None:
    leaked: list[str] = []

    def key() -> str:
        leaked.append(aws_key())
        return leaked[-1]

    async with mcp_session(mcp_url, master_key) as s:
        for field in REMEMBER_TEXT_FIELDS:
            err = await rpc_error(s, "remember", {**REMEMBER, "workspace": unique(), field: f"uploader-{key()}"})
            assert refused_for(err, field), (field, err)
        err = await rpc_error(s, "remember", {**REMEMBER, "keywords": ["uploader", key()]})
        assert refused_for(err, "keywords"), err

        # amend: phase (and the other texts) of an existing fragment.
        ws = unique()
        stored = await call(s, "remember", {**REMEMBER, "workspace": ws, "phase": "build"})
        for field in ("phase", "outcome", "topic", "agentId"):
            err = await rpc_error(s, "amend", {"id": stored["id"], field: f"uploader-{key()}"})
            assert refused_for(err, field), (field, err)
        assert (await fragment(stack.database_url, stored["id"]))["phase"] == "build"

        # batch_remember: its own fields refuse the call; an item's field fails that item.
        for field in ("workspace", "agentId"):
            err = await rpc_error(s, "batch_remember", {"fragments": [REMEMBER], field: f"ws-{key()}"})
            assert refused_for(err, field), (field, err)
        batch = await call(s, "batch_remember", {"workspace": unique(), "fragments": [
            {**REMEMBER, "phase": f"deploy {key()}"}, {**REMEMBER, "content": "A clean item is stored as usual here."}]})
        assert [r["success"] for r in batch["results"]] == [False, True]
        assert "aws_access_key" in batch["results"][0]["error"]

        # reflect: the session id and the task feedback are stored outside the fragments.
        err = await rpc_error(s, "reflect", {"sessionId": f"sess-{key()}", "decisions": ["Ship on Fridays only."]})
        assert refused_for(err, "sessionId"), err
        err = await rpc_error(s, "reflect", {"decisions": ["Ship on Fridays only."],
                                             "task_effectiveness": {"outcome": "completed", "evidence": f"used {key()}"}})
        assert refused_for(err, "task_effectiveness.evidence"), err

        # tool_feedback (recall): suggestion and context are stored.
        for field in ("suggestion", "context"):
            err = await rpc_error(s, "tool_feedback", {"tool_name": "recall", "relevant": False, "sufficient": False,
                                                       field: f"use {key()}"})
            assert refused_for(err, field), (field, err)

    # admin import: an item's phase fails that item.
    body = (await import_(stack, master_key, [{**REMEMBER, "workspace": unique(), "phase": f"p-{key()}"}])).json()
    assert body["failed"] == 1 and "aws_access_key" in body["results"][0]["error"]

    assert await tables_holding(stack.database_url, leaked) == []


async def test_config_talk_is_stored_as_written(stack: Stack, mcp_url: str, master_key: str) -> None:
    # The three lines issue 15 found refused wrongly, in content and in other fields.
    content = "Set max_token=4096 for the summariser; first_pass=done, and the linter runs pass=three."
    async with mcp_session(mcp_url, master_key) as s:
        reply = await call(s, "remember", {"content": content, "topic": "config", "type": "fact", "workspace": unique(),
                                           "phase": "first_pass=done", "goal": "max_token=4096"})
    assert reply["success"] is True and "secrets_redacted" not in reply
    row = await fragment(stack.database_url, reply["id"])
    assert (row["content"], row["phase"], row["goal"]) == (content, "first_pass=done", "max_token=4096")


@pytest.fixture(scope="module")
def redacting(stack: Stack, stack_dir: Path) -> Iterator[Stack]:
    config = new_stack_config(stack_dir / "secrets-redact", database_url=stack.database_url)
    config.extra_env = {**config.extra_env, "ENGRAM_SECRET_POLICY": "redact"}
    with Stack(config) as own:
        yield own


async def test_redact_policy_stores_every_field_redacted(redacting: Stack) -> None:
    content_key, phase_key, feedback_key = aws_key(), aws_key(), aws_key()
    async with mcp_session(redacting.mcp_url, redacting.master_key) as s:
        reply = await call(s, "remember", {"content": f"The uploader signs with {content_key} every night.", "topic": "ops",
                                           "type": "fact", "workspace": unique(), "phase": f"rotate {phase_key}"})
        feedback = await call(s, "tool_feedback", {"tool_name": "recall", "relevant": False, "sufficient": False,
                                                   "suggestion": f"use {feedback_key} instead"})
    assert reply["success"] is True and reply["secrets_redacted"] == ["aws_access_key"]
    row = await fragment(redacting.database_url, reply["id"])
    assert row["content"] == "The uploader signs with [REDACTED:aws_access_key] every night."
    assert row["phase"] == "rotate [REDACTED:aws_access_key]"
    async with db(redacting.database_url) as conn:
        suggestion = await conn.fetchval("SELECT suggestion FROM tool_feedback WHERE id = $1", feedback["id"])
    assert suggestion == "use [REDACTED:aws_access_key] instead"
    assert await tables_holding(redacting.database_url, [content_key, phase_key, feedback_key]) == []


async def test_redact_policy_still_refuses_a_secret_in_an_idempotency_key(redacting: Stack) -> None:
    # Redacted, two different keys would become one and the second write would replay the first.
    first, second = aws_key(), aws_key()
    async with mcp_session(redacting.mcp_url, redacting.master_key) as s:
        for key in (first, second):
            err = await rpc_error(s, "remember", {"content": f"Deploy window noted ({key[-4:]}).", "topic": "ops",
                                                 "type": "fact", "idempotencyKey": f"deploy-{key}"})
            assert err.code == -32602 and "idempotencyKey" in err.message
    assert await tables_holding(redacting.database_url, [first, second]) == []
