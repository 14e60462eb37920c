"""batch_remember screens each distinct field text of a batch once (issue 22 item 2,
session 11): a batch's items repeat their topic, type, workspace and agentId, and secret
screening of each copy was a third of the ingest service's own CPU per LoCoMo turn. What
is refused or redacted stays exactly as before, item by item."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.internal import ToolContext
from services.ingest.batch import plan_items
from services.ingest.service import WriteResources
from shared.contract.write import BatchRememberArgs
from shared.domain import secrets
from shared.domain.principal import Principal
from tests.support import Stack, call, mcp_session, unique

AWS = "AKIAIOSFODNN7EXAMPLE"


def test_a_batch_screens_its_repeated_fields_once(monkeypatch: pytest.MonkeyPatch) -> None:
    screened: list[str] = []
    find = secrets.find_secrets

    def counting(text: str) -> list[secrets.SecretFinding]:
        screened.append(text)
        return find(text)

    monkeypatch.setattr(secrets, "find_secrets", counting)
    items = [{"content": f"Turn {i}: we moved the standup to nine on Mondays.", "topic": "team", "type": "episode",
              "workspace": "ws-team", "agentId": "planner"} for i in range(40)]
    args = BatchRememberArgs.model_validate({"fragments": items})
    results: list[Any] = [None] * len(items)
    planned = plan_items(WriteResources(pool=None, embedder=None), ToolContext(principal=Principal.master()),  # type: ignore[arg-type]
                         args, results)

    assert len(planned) == 40 and results == [None] * 40
    # Each content once; topic, type, workspace, agentId (and the defaults the model fills
    # in) once for the whole batch: before, each of them once per item (40 x 8 texts).
    assert len(screened) == len(set(screened)), sorted(screened)
    assert {item["content"] for item in items} | {"team", "episode", "ws-team", "planner"} <= set(screened)


async def test_a_repeated_secret_is_refused_in_every_item(stack: Stack) -> None:
    ws = unique()
    clean = {"content": "The standup moved to nine on Mondays.", "topic": "team", "type": "fact"}
    async with mcp_session(stack.mcp_url, stack.master_key) as s:
        batch = await call(s, "batch_remember", {"workspace": ws, "fragments": [
            {**clean, "phase": f"deploy {AWS}"},
            {**clean, "content": "The retro is on Fridays after lunch."},
            {**clean, "content": "The demo is on Thursdays at four.", "phase": f"deploy {AWS}"},
            {**clean, "content": "The planning call is on Tuesdays.", "phase": "deploy"},
        ]})
    assert [r["success"] for r in batch["results"]] == [False, True, False, True]
    assert all("aws_access_key" in batch["results"][i]["error"] for i in (0, 2))
