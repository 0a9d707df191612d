"""gatewayd: one authenticated JSON-RPC / MCP endpoint in front of supervised stdio tool servers."""

__version__ = "0.1.0"
