"""The wire contract of the MCP tools: argument models (validated by the services, turned
into each tool's inputSchema by the gateway) and the catalog of tools."""
