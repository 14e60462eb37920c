"""The gateway: the one public door of Engram. It owns no memory logic; it authenticates,
limits, keeps MCP session identity and forwards tool calls to recall / ingest.

Layout: one shared core, one package per surface, each surface a thin adapter onto the core.

    app.py       create_app + the lifespan that builds the one typed GatewayState
    core/        auth, limits, the front door (edge), dependency errors -> 503, forwarding to
                 recall / ingest (upstream), daily call counts (usage), state.py (GatewayState)
    sessions/    the one owner of MCP session identity (open, resolve, segment, rotate, close)
    mcp/         the MCP surface: Streamable HTTP + legacy SSE transports, the tool / prompt /
                 resource handler, modes, the skill guide, session rotation
    admin/       the admin REST surface (keys, groups, import/export, maintenance)
    oauth/       the OAuth 2.0 surface (authorization server, consent page)

Surfaces still to come (the admin console, two REST APIs) go in as sibling packages of
mcp/, admin/ and oauth/, built on core/ and sessions/ the same way.
"""
