"""The remember profile (reference 003): an MCP surface at /mcp/remember-profile whose
`remember` takes content, path and create_project, with the read tools that confirm a write
through a scoped search. A thin adapter onto the gateway core, beside mcp/."""

from services.gateway.remember_profile.surface import PROFILE_PATH, install

__all__ = ["PROFILE_PATH", "install"]
