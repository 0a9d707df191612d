"""All tool servers by name: build them from a Snapshot, apply a new one, start the eager ones, stop them all.

Owns the mapping name → ToolServer, whole-pool start/stop, and applying a reloaded config:
unchanged servers are kept as they are (same child), added ones appear, and removed or changed
ones are retired — no new calls, calls in flight drain up to a deadline, then the old child
stops — while new calls of a changed server go to a new one at once. Does not own any single
server's lifecycle (server.py) or deciding when to reload (reloader.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gatewayd.config.loader import Snapshot
from gatewayd.upstream.server import ToolServer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolDiff:
    """Which servers a reload added, removed, changed (restarted as new children) or left alone."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def touched(self) -> list[str]:
        """Servers whose tools may look different now."""
        return sorted(self.added + self.removed + self.changed)


class Pool:
    """The tool servers of the current snapshot, and the retired ones still draining."""

    def __init__(self, snapshot: Snapshot, on_tools_changed: Callable[[str], None] | None = None) -> None:
        self._on_tools_changed = on_tools_changed
        self.generation = 1
        self.servers: dict[str, ToolServer] = {
            name: self._make(name, snapshot) for name, config in sorted(snapshot.servers.items())
        }
        # Retired servers and the task draining each; owned here so shutdown can stop them too.
        self._retiring: dict[ToolServer, asyncio.Task[None]] = {}
        self._starting: set[asyncio.Task[None]] = set()

    def _make(self, name: str, snapshot: Snapshot) -> ToolServer:
        return ToolServer(name, snapshot.servers[name], snapshot.config_dir, self._on_tools_changed,
                          self.generation)

    def get(self, name: str) -> ToolServer | None:
        """The server called `name`, if configured."""
        return self.servers.get(name)

    def apply(self, snapshot: Snapshot, drain: float, generation: int) -> PoolDiff:
        """Switch to `snapshot` (config `generation`) at once; retire the old servers in the background (see the
        module doc)."""
        self.generation = generation
        diff = PoolDiff()
        servers: dict[str, ToolServer] = {}
        for name, config in sorted(snapshot.servers.items()):
            old = self.servers.get(name)
            if old is not None and old.config == config and old.config_dir == snapshot.config_dir:
                servers[name] = old
                diff.unchanged.append(name)
                continue
            servers[name] = self._make(name, snapshot)
            (diff.changed if old is not None else diff.added).append(name)
            if old is not None:
                self._retire(old, "was changed by a config reload", drain)
        for name, old in self.servers.items():
            if name not in servers:
                diff.removed.append(name)
                self._retire(old, "was removed by a config reload", drain)
        self.servers = servers
        fresh = [servers[name] for name in diff.added + diff.changed if servers[name].config.start == "eager"]
        if fresh:
            task = asyncio.create_task(self._start(fresh), name="eager-start-after-reload")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        return diff

    def _retire(self, server: ToolServer, why: str, drain: float) -> None:
        task = asyncio.create_task(server.retire(why, drain), name=f"{server.name}-retire")
        self._retiring[server] = task
        task.add_done_callback(lambda _: self._retiring.pop(server, None))

    @property
    def retiring(self) -> list[ToolServer]:
        """Servers a reload replaced or removed that are still draining."""
        return list(self._retiring)

    async def start_eager(self) -> None:
        """Start every `start = "eager"` server; one that fails is logged and retried on its first call."""
        await self._start([server for server in self.servers.values() if server.config.start == "eager"])

    async def _start(self, servers: list[ToolServer]) -> None:
        results = await asyncio.gather(*(server.ensure_running() for server in servers), return_exceptions=True)
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("server=%s eager start failed: %s", server.tag, result)

    async def stop_all(self) -> None:
        """Stop every child, current and retiring, concurrently; each stop is bounded by its own escalation."""
        retiring = list(self._retiring)
        tasks = [*self._starting, *self._retiring.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(server.stop() for server in [*self.servers.values(), *retiring]))
