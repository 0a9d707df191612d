"""All tool servers by name: build them from a Snapshot, start the eager ones, stop them all.

Owns the mapping name → ToolServer and whole-pool start/stop. Does not own any single
server's lifecycle (server.py). Applying a config diff with drain is the reload issue's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gatewayd.config.loader import Snapshot
from gatewayd.upstream.server import ToolServer

logger = logging.getLogger(__name__)


class Pool:
    """The tool servers of one snapshot."""

    def __init__(self, snapshot: Snapshot, on_tools_changed: Callable[[str], None] | None = None) -> None:
        self.servers: dict[str, ToolServer] = {
            name: ToolServer(name, config, snapshot.config_dir, on_tools_changed)
            for name, config in sorted(snapshot.servers.items())
        }

    def get(self, name: str) -> ToolServer | None:
        """The server called `name`, if configured."""
        return self.servers.get(name)

    async def start_eager(self) -> None:
        """Start every `start = "eager"` server; one that fails is logged and retried on its first call."""
        eager = [server for server in self.servers.values() if server.config.start == "eager"]
        results = await asyncio.gather(*(server.ensure_running() for server in eager), return_exceptions=True)
        for server, result in zip(eager, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("server=%s eager start failed: %s", server.name, result)

    async def stop_all(self) -> None:
        """Stop every child concurrently; each stop is bounded by its own escalation."""
        await asyncio.gather(*(server.stop() for server in self.servers.values()))
