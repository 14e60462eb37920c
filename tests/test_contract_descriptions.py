"""Tools describe themselves: every input parameter says what it is for, recall says where
its query goes, and each tool carries the standard MCP annotations beside the reference's meta."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.internal import parse_arguments
from shared.contract.catalog import TOOLS, TOOLS_BY_NAME
from shared.contract.read import RecallArgs
from shared.domain.errors import InvalidParams


def _properties(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every property of a tool's schema, nested models ($defs: timeRange's from/to,
    reflect's task_effectiveness) included."""
    found = list(schema.get("properties", {}).items())
    for name, model in schema.get("$defs", {}).items():
        found.extend((f"{name}.{prop}", body) for prop, body in model.get("properties", {}).items())
    return found


@pytest.mark.parametrize("spec", TOOLS, ids=lambda spec: spec.name)
def test_every_parameter_has_a_description(spec) -> None:
    missing = [name for name, body in _properties(spec.input_schema()) if not str(body.get("description", "")).strip()]
    assert missing == []


def test_recall_says_its_query_goes_in_text() -> None:
    spec = TOOLS_BY_NAME["recall"]
    assert "`text`" in spec.description
    assert "query" in spec.input_schema()["properties"]["text"]["description"]
    # The schema stays the reference's: `query` is taken as text, not advertised.
    assert "query" not in spec.input_schema()["properties"]


def test_recall_takes_query_as_an_alias_of_text() -> None:
    assert parse_arguments(RecallArgs, {"query": "why did the deploy fail"}).text == "why did the deploy fail"
    # An explicit text wins; a non-string query is ignored like any unknown argument.
    assert parse_arguments(RecallArgs, {"text": "a", "query": "b"}).text == "a"
    assert parse_arguments(RecallArgs, {"query": 5, "keywords": ["x"]}).text is None
    with pytest.raises(InvalidParams):
        parse_arguments(RecallArgs, {"query": "x" * 5000})


EXPECTED_ANNOTATIONS = {
    # tool: (readOnlyHint, destructiveHint, idempotentHint)
    "recall": (True, False, True),
    "context": (True, False, True),
    "memory_stats": (True, False, True),
    "batch_status": (True, False, True),
    "get_skill_guide": (True, False, True),
    "tool_feedback": (False, False, False),
    "remember": (False, False, False),
    "batch_remember": (False, False, False),
    "reflect": (False, False, False),
    "link": (False, False, True),
    "forget": (False, True, False),
    "amend": (False, True, False),
    "session_rotate": (False, True, False),
    "memory_consolidate": (False, True, True),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ANNOTATIONS))
def test_annotations_follow_the_risk_level(name: str) -> None:
    spec = TOOLS_BY_NAME[name]
    got = spec.annotations()
    assert (got["readOnlyHint"], got["destructiveHint"], got["idempotentHint"]) == EXPECTED_ANNOTATIONS[name]
    assert got["openWorldHint"] is False
    # The hints agree with the reference's meta they are derived from.
    assert got["idempotentHint"] == spec.meta()["idempotent"]
    if spec.meta()["riskLevel"] != "read":
        assert got["readOnlyHint"] is False


def test_every_tool_has_annotations_the_mcp_sdk_accepts() -> None:
    from mcp import types

    for spec in TOOLS:
        tool = types.Tool(name=spec.name, input_schema=spec.input_schema(), annotations=spec.annotations(), meta=spec.meta())
        listed = tool.model_dump(by_alias=True, exclude_none=True)
        assert set(listed["annotations"]) == {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}
