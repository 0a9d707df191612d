"""Example stdio tool servers (stdlib only) that gatewayd can supervise: ``calc`` (plain JSON-RPC 2.0),
``shell`` and ``clock`` (minimal MCP servers). Each runs as ``python3 -m gatewayd.examples.<name>``."""
