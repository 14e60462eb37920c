"""MCP session identity: the one owner of which logical session an Mcp-Session-Id names."""
