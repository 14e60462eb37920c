"""Web-layer pieces the internal services share (FastAPI lives here, never in shared/)."""
