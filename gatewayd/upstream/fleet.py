"""A tool server with a child per client or per MCP session: `isolation = "client"` or `"session"` in tools.d.

Owns, for one such server, the table of its children by owner (the client's name, or the session's id),
starting one the first time its owner calls, and the limits on them: `max_children` of this server at
once, `max_children_per_client` of one client among them, and the daemon's `max_isolated_children`
across every such server (`ChildBudget`); past any, the call is refused with `-32014` and the reason,
after children that hold nothing (no process, no call) have been let go. A session's child stops when
the session ends; any child stops when idle, like a shared one, and a later call of its owner starts it
again. Nothing one owner sends reaches another owner's child, so whatever a child hands out (a session id,
a handle) is bound to the owner that received it.

A per-session child's own requests outside any call (roots at start-up, after a roots change) are put to
its session's client (`Delivery.owner`, relay.py); `roots_changed` tells that session's children that
asked for roots. Listing what the server offers (tools, resources, prompts) is done by a child of no
owner, the lister, which is never sent a call. Reload, restart, status and stop apply to every child.
Does not own one child's lifecycle (server.py) or building the generation's table (pool.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatewayd.config.models import ServerConfig
from gatewayd.elicitations import COMPLETE as ELICITATION_COMPLETE
from gatewayd.errors import InvalidRequest, Overloaded, ToolServerUnavailable
from gatewayd.sessions import SESSION_ID_SHOWN
from gatewayd.upstream.api import ANYONE, Delivery, ToolDef
from gatewayd.upstream.eras import Eras
from gatewayd.upstream.server import State, ToolServer

logger = logging.getLogger(__name__)

# The notifications of an owner's child that concern its owner's calls and subscriptions, and are passed on.
OWNER_EVENTS = frozenset({"notifications/resources/updated", "notifications/tasks/status", ELICITATION_COMPLETE})


class ChildBudget:
    """The daemon's bound on per-client and per-session children, across every server (`max_isolated_children`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(0, self.used - 1)


class Fleet:
    """One tools.d server whose children belong to one client or one session each; quacks like a ToolServer."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        config_dir: Path,
        budget: ChildBudget,
        on_tools_changed: Callable[[str], None] | None = None,
        generation: int = 1,
        on_surface_event: Callable[[str, dict[str, Any]], None] | None = None,
        eras: Eras | None = None,
        on_client_log: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.config_dir = config_dir
        self.isolation = config.isolation
        self.protocol = config.protocol
        self._budget = budget
        self._generation = generation
        self._on_tools_changed = on_tools_changed
        self._on_surface_event = on_surface_event
        # Told (client, line) of a per-client child's log lines outside any call (its client's sessions hear them).
        self._on_client_log = on_client_log
        # Every child runs the same program: the era the first one's probe found serves them all (eras.py).
        self._eras = eras if eras is not None else Eras()
        self.lister = ToolServer(name, config, config_dir, on_tools_changed, generation, on_surface_event,
                                 eras=self._eras)
        self.prefix = self.lister.prefix
        self.tag = self.lister.tag
        # Children by owner key, the client each belongs to, and how to stop listening for a session's end.
        self._children: dict[str, ToolServer] = {}
        self._clients: dict[str, str] = {}
        self._unwatch: dict[str, Callable[[], None]] = {}
        # Stops of children whose owner went away, running; owned here so `stop` waits for them.
        self._stopping: set[asyncio.Task[None]] = set()
        self.retired: str | None = None
        # Calls that waited for a slot of a child since gone, so the server's count never goes back.
        self._queued_by_gone = 0

    # -- what the pipeline asks ------------------------------------------------------------

    def needs_confirmation(self, method: str) -> bool:
        return self.config.needs_confirmation(method)

    def is_dangerous(self, method: str) -> bool:
        return self.config.is_dangerous(method)

    def task_mode(self, method: str) -> str:
        return self.lister.task_mode(method)

    def deadline_for(self, method: str) -> float:
        return self.lister.deadline_for(method)

    async def has_tool(self, method: str) -> bool:
        return await self.lister.has_tool(method)

    async def tools(self) -> list[ToolDef]:
        return await self.lister.tools()

    def tools_known(self) -> list[ToolDef] | None:
        return self.lister.tools_known()

    async def surface(self, kind: str) -> list[dict[str, Any]]:
        return await self.lister.surface(kind)

    def surface_known(self, kind: str) -> list[dict[str, Any]] | None:
        return self.lister.surface_known(kind)

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        return await self._child(delivery).call_tool(tool, arguments, delivery)

    async def call_method(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        return await self._child(delivery).call_method(method, params, delivery)

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        return await self._child(delivery).call_surface(method, params, delivery)

    async def notify(self, method: str, params: Any, delivery: Delivery = ANYONE) -> bool:
        return await self._child(delivery).notify(method, params, delivery)

    async def roots_changed(self, session: str) -> None:
        child = self._children.get(session) if self.isolation == "session" else None
        if child is not None:
            await child.tell_roots_changed()

    # -- children --------------------------------------------------------------------------

    def _child(self, delivery: Delivery) -> ToolServer:
        """The child of the call's owner, made (not started) if it has none yet."""
        if self.retired is not None:
            raise ToolServerUnavailable(f"tool server {self.name!r} {self.retired}; retry the call",
                                        {"server": self.name})
        if self.isolation == "session":
            if delivery.session is None:
                raise InvalidRequest(f"tool server {self.name!r} runs one child per MCP session: call it within a "
                                     "session (initialize first, then send its Mcp-Session-Id)")
            key = delivery.session.id
        else:
            key = delivery.client
        child = self._children.get(key)
        if child is None:
            child = self._admit(key, delivery)
        return child

    def _admit(self, key: str, delivery: Delivery) -> ToolServer:
        """A new child for `key`, within every limit (children that hold nothing are let go first)."""
        client = delivery.client
        if len(self._children) >= self.config.max_children or self._held_by(client) >= \
                self.config.max_children_per_client or self._budget.used >= self._budget.limit:
            self._let_go_dormant()
        if self._held_by(client) >= self.config.max_children_per_client:
            raise self._refuse(f"this client holds {self.config.max_children_per_client} of its children "
                               "(max_children_per_client); end a session or wait for one to idle out")
        if len(self._children) >= self.config.max_children:
            raise self._refuse(f"it runs {self.config.max_children} children (max_children)")
        if not self._budget.take():
            raise self._refuse(f"the daemon runs {self._budget.limit} per-client and per-session children "
                               "(max_isolated_children)")
        shown = key[:SESSION_ID_SHOWN] if self.isolation == "session" else key
        # What clients are shown is the lister's: an owner's child says only what concerns its own calls.
        child = ToolServer(self.name, self.config, self.config_dir, None, self._generation, self._owner_event,
                           owner=delivery.owner, tag=f" {self.isolation}={shown}", private=True, eras=self._eras,
                           on_log=self._log_hearer(client, delivery))
        self._children[key] = child
        self._clients[key] = client
        if self.isolation == "session" and delivery.session is not None:
            self._unwatch[key] = delivery.session.on_end(lambda: self._drop(key, "its session ended"))
        return child

    def _log_hearer(self, client: str, delivery: Delivery) -> Callable[[dict[str, Any]], None] | None:
        """Who hears a new child's log lines outside any call: its session, or every session of its client."""
        if self.isolation == "session":
            return delivery.session.hear if delivery.session is not None else None
        on_client_log = self._on_client_log
        return functools.partial(on_client_log, client) if on_client_log is not None else None

    def _owner_event(self, name: str, message: dict[str, Any]) -> None:
        """An owner's child's notification: a resource update or a task's status is passed on; its list changes are
        not (the lists clients see are the lister's)."""
        if message.get("method") in OWNER_EVENTS and self._on_surface_event is not None:
            self._on_surface_event(name, message)

    def _refuse(self, why: str) -> Overloaded:
        return Overloaded(f"tool server {self.name!r} cannot start another child: {why}",
                          {"server": self.name, "isolation": self.isolation})

    def _held_by(self, client: str) -> int:
        return sum(1 for owner in self._clients.values() if owner == client)

    def _let_go_dormant(self) -> None:
        for key in [key for key, child in self._children.items() if child.dormant]:
            self._forget(key)

    def _forget(self, key: str) -> ToolServer | None:
        child = self._children.pop(key, None)
        self._clients.pop(key, None)
        unwatch = self._unwatch.pop(key, None)
        if unwatch is not None:
            unwatch()
        if child is not None:
            self._budget.give()
            self._queued_by_gone += child.queued_total
        return child

    def _drop(self, key: str, why: str) -> None:
        """The owner went away: its child stops (calls in flight fail)."""
        child = self._forget(key)
        if child is None:
            return
        logger.info("server=%s %s: stopping its child", child.tag, why)
        task = asyncio.get_running_loop().create_task(child.stop(), name=f"{self.name}-drop")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    # -- lifecycle, as ToolServer ----------------------------------------------------------

    @property
    def processes(self) -> list[ToolServer]:
        """The servers whose children this one runs: the lister and each owner's."""
        return [self.lister, *self._children.values()]

    @property
    def state(self) -> State:
        """The lister's state, or running while any owner's child runs."""
        if any(child.state is State.RUNNING for child in self._children.values()):
            return State.RUNNING
        return self.lister.state

    @property
    def pid(self) -> int | None:
        return self.lister.pid

    @property
    def restarts(self) -> int:
        return sum(server.restarts for server in self.processes)

    async def ensure_running(self) -> None:
        """Start the lister (an eager start): owners' children start with their owners' first calls."""
        await self.lister.ensure_running()

    def reset(self) -> None:
        for server in self.processes:
            server.reset()

    async def restart(self) -> None:
        """An admin restart: every child stops (forgetting its crashes); each owner's next call starts a new one."""
        children = [self._forget(key) for key in list(self._children)]
        await asyncio.gather(*(child.stop() for child in children if child is not None), *self._stopping,
                             return_exceptions=True)
        await self.lister.restart()

    async def retire(self, why: str, drain: float) -> None:
        """After a reload: every child drains up to `drain` seconds, then stops."""
        self.retired = why
        children = [self.lister, *self._children.values()]
        for key in list(self._children):
            self._forget(key)
        await asyncio.gather(*(child.retire(why, drain) for child in children))

    async def stop(self) -> None:
        children = [self.lister, *self._children.values()]
        for key in list(self._children):
            self._forget(key)
        await asyncio.gather(*(child.stop() for child in children), *self._stopping, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        """The lister's status, with the calls of every child and a row for each owner's."""
        status = self.lister.status()
        children = []
        for key, child in sorted(self._children.items()):
            row = child.status()
            row["owner"] = key[:SESSION_ID_SHOWN] if self.isolation == "session" else key
            row["client"] = self._clients[key]
            children.append(row)
        status.update(state=str(self.state), isolation=self.isolation, children=children,
                      in_flight=status["in_flight"] + sum(row["in_flight"] for row in children),
                      waiting=status["waiting"] + sum(row["waiting"] for row in children),
                      queued_total=status["queued_total"] + self._queued_by_gone
                      + sum(row["queued_total"] for row in children),
                      restarts=self.restarts)
        return status
