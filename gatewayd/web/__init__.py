"""The HTTP side: routes and guards (app.py), MCP Streamable HTTP (mcp_http.py), SSE (sse.py), limits
(limits.py), the approval page (console.py); aiohttp's internals are touched only in aiohttp_hooks.py."""
