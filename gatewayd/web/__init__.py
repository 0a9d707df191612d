"""The HTTP side: routes and limits (app.py), bearer tokens (auth.py), MCP Streamable HTTP (mcp_http.py)."""
