"""The MCP surface: Streamable HTTP (/mcp), legacy SSE (/sse + /message), tools, prompts, resources."""
