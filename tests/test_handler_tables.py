"""Each service's internal tool table is joined from its surfaces' tables; a name defined by two
surfaces would serve one surface's handler for both (the REST API of reference 001 once named
its statistics handler `memory_stats`, and MCP memory_stats answered its shape)."""

from __future__ import annotations

import pytest

from services.common.handlers import joined


def test_a_name_defined_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="memory_stats"):
        joined({"memory_stats": 1, "recall": 2}, {"memory_stats": 3})


def test_the_services_tables_keep_every_mcp_tool_their_own() -> None:
    from services.ingest import api as ingest_api
    from services.recall import api as recall_api
    from services.recall import tools

    assert recall_api.tool_handlers["memory_stats"].__closure__ is not None
    # The MCP tool is served by recall's tools module, not by another surface's handler.
    inner = recall_api.tool_handlers["memory_stats"].__closure__[0].cell_contents
    assert inner is tools.memory_stats
    assert "memory_api_stats" in recall_api.tool_handlers
    assert {"remember", "forget", "amend", "link"} <= ingest_api.tool_handlers.keys()
