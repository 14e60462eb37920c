"""The memory REST API of reference 001 (/api/v1/memory): routes.py (namespaces, entries,
search, context, export / import, bulk, extraction, consolidation) and events.py (SSE and
WebSocket), thin adapters onto the gateway's core that forward to recall and ingest."""
