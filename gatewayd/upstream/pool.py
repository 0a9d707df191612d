"""All tool servers' lives: build a generation's servers from a Snapshot, retire replaced ones, stop them all.

Owns making the name → ToolServer table of each config generation (generation.py holds it):
unchanged servers are kept as they are (same child), added and changed ones are new; once a
reload has swapped generations, removed or changed servers are retired — no new calls, calls
in flight drain up to a deadline, then the old child stops — while new calls of a changed
server go to its new one at once. Also starting the eager servers, and stopping every child,
current and retiring, at shutdown. Does not own any single server's lifecycle (server.py),
which table is current (generation.py) or deciding when to reload (reloader.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatewayd.config.loader import Snapshot
from gatewayd.upstream.eras import Eras
from gatewayd.upstream.fleet import ChildBudget, Fleet
from gatewayd.upstream.server import ToolServer

# One tools.d server: one shared child, or a child per client or per session.
Server = ToolServer | Fleet
# Per-client and per-session children the daemon runs at once when its settings do not say.
DEFAULT_ISOLATED_CHILDREN = 256

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
    """The life of every tool server: a generation's table built, replaced servers retired, all stopped."""

    def __init__(self, on_tools_changed: Callable[[str], None] | None = None,
                 on_surface_event: Callable[[str, dict[str, Any]], None] | None = None,
                 max_isolated_children: int = DEFAULT_ISOLATED_CHILDREN,
                 on_child_up: Callable[[ToolServer], None] | None = None,
                 needed: Callable[[str], bool] | None = None,
                 on_client_log: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self._on_tools_changed = on_tools_changed
        # Told (client, line) of a per-client child's log lines outside any call (fleet.py).
        self._on_client_log = on_client_log
        self._on_surface_event = on_surface_event
        self._on_child_up = on_child_up
        # Whether sessions hold resource subscriptions at a server's child (surfaces.py): it runs even without calls.
        self._needed = needed
        # Shared by every generation's per-client and per-session children.
        self.budget = ChildBudget(max_isolated_children)
        # What the era probe found for each server's program, kept across restarts, children and reloads (eras.py).
        self.eras = Eras()
        # Retired servers and the task draining each; owned here so shutdown can stop them too.
        self._retiring: dict[Server, asyncio.Task[None]] = {}
        self._starting: set[asyncio.Task[None]] = set()

    def build(
        self, snapshot: Snapshot, generation: int, previous: Mapping[str, Server] | None = None
    ) -> tuple[dict[str, Server], PoolDiff]:
        """The servers of config `generation`: those of `previous` whose config is unchanged (same child), new ones
        for the rest. Nothing starts or stops here."""
        previous = previous or {}
        diff = PoolDiff()
        servers: dict[str, Server] = {}
        for name, config in sorted(snapshot.servers.items()):
            old = previous.get(name)
            if old is not None and old.config == config and old.config_dir == snapshot.config_dir:
                servers[name] = old
                diff.unchanged.append(name)
                continue
            if config.isolation == "shared":
                servers[name] = ToolServer(name, config, snapshot.config_dir, self._on_tools_changed, generation,
                                          self._on_surface_event, self._on_child_up, self._needed, eras=self.eras)
            else:
                # An owner's subscriptions live and end with its own child: nothing to renew on a new one.
                servers[name] = Fleet(name, config, snapshot.config_dir, self.budget, self._on_tools_changed,
                                      generation, self._on_surface_event, self.eras, self._on_client_log)
            (diff.changed if old is not None else diff.added).append(name)
        diff.removed.extend(name for name in previous if name not in servers)
        return servers, diff

    def switched(self, previous: Mapping[str, Server], current: Mapping[str, Server], drain: float) -> None:
        """After a reload swapped `previous` for `current`: retire the servers no longer current in the background
        (see the module doc) and start the new eager ones, and those sessions hold subscriptions at."""
        for name, old in previous.items():
            if current.get(name) is not old:
                why = "was changed by a config reload" if name in current else "was removed by a config reload"
                self._retire(old, why, drain)
        fresh = [server for name, server in current.items() if previous.get(name) is not server
                 and (server.config.start == "eager" or (self._needed is not None and self._needed(name)))]
        if fresh:
            task = asyncio.create_task(self._start(fresh), name="eager-start-after-reload")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    def _retire(self, server: Server, why: str, drain: float) -> None:
        task = asyncio.create_task(server.retire(why, drain), name=f"{server.name}-retire")
        self._retiring[server] = task
        task.add_done_callback(lambda _: self._retiring.pop(server, None))

    @property
    def retiring(self) -> list[Server]:
        """Servers a reload replaced or removed that are still draining."""
        return list(self._retiring)

    async def start_eager(self, servers: Mapping[str, Server]) -> None:
        """Start every `start = "eager"` server; one that fails is logged and retried on its first call."""
        await self._start([server for server in servers.values() if server.config.start == "eager"])

    async def _start(self, servers: list[Server]) -> None:
        results = await asyncio.gather(*(server.ensure_running() for server in servers), return_exceptions=True)
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("server=%s eager start failed: %s", server.tag, result)

    async def stop_all(self, current: Mapping[str, Server]) -> None:
        """Stop every child, current and retiring, concurrently; each stop is bounded by its own escalation."""
        retiring = list(self._retiring)
        tasks = [*self._starting, *self._retiring.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(server.stop() for server in [*current.values(), *retiring]))
