"""The memory REST API's internal tools served by ingest (reference 001's writes, the model
passes and the consolidation status), by name, for services/ingest/api.py."""

from __future__ import annotations

from services.ingest.memory_api import OPERATIONS, memory_handler
from services.ingest.memory_consolidation import CONSOLIDATION_OPERATIONS

MEMORY_TOOL_HANDLERS = {name: memory_handler(op) for name, op in {**OPERATIONS, **CONSOLIDATION_OPERATIONS}.items()}
