"""One tool server: lifecycle, lazy start, tool cache, admission, idle stop, restart backoff.

Owns the state machine of one `tools.d/<name>.toml` entry and at most one live Connection
to its child, and implements the gateway's `Upstream` interface (api.py) over it, speaking
the server's dialect (dialects.py). Concurrent first calls share one start. A crash fails
the calls in flight (connection.py) and delays the next start by an exponential backoff;
too many crashes in a window leave the server `failed` until its config changes or an
admin restarts it. A child sessions hold resource subscriptions at (surfaces.py) runs for
them without calls: it is not stopped idle, and is started again once it exits. Does not
own routing or policy (gateway.py), what a protocol says on the wire (dialects.py) or the
set of servers (pool.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatewayd.config.loader import exposed_prefix
from gatewayd.config.models import ServerConfig
from gatewayd.deadlines import Deadlines
from gatewayd.elicitations import COMPLETE as ELICITATION_COMPLETE
from gatewayd.errors import (
    GatewayError,
    Overloaded,
    ToolServerFailed,
    ToolServerUnavailable,
)
from gatewayd.upstream.api import ANYONE, Caller, Delivery, ToolDef
from gatewayd.upstream.connection import Connection
from gatewayd.upstream.eras import Eras, era_key
from gatewayd.upstream.protocols import dialect_for

logger = logging.getLogger(__name__)

# First restart delay after a crash; doubles per crash in the window, capped below.
BACKOFF_BASE = 0.5
BACKOFF_MAX = 30.0
# A child's notifications about its resources and prompts (passed on by surfaces.tell), and which cached lists
# each makes stale.
STALE_AFTER: dict[str, tuple[str, ...]] = {
    "notifications/resources/list_changed": ("resources", "resourceTemplates"),
    "notifications/prompts/list_changed": ("prompts",),
    "notifications/resources/updated": (),
    # Not about resources or prompts, but told the same way: a task's status (tasks.py).
    "notifications/tasks/status": (),
}
# Shortest idle re-check, so a timer that fires a hair early does not spin.
IDLE_MIN_WAIT = 0.01
# What a protocol without resources and prompts lists: one list for all, read and never changed (as cached lists).
NOTHING_LISTED: list[dict[str, Any]] = []


class State(enum.StrEnum):
    """Where a tool server is in its life."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"


class ToolServer:
    """A tool server by name. Start it with `ensure_running`, call through `call_tool`/`call_method`, end with
    `stop`."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        config_dir: Path,
        on_tools_changed: Callable[[str], None] | None = None,
        generation: int = 1,
        on_surface_event: Callable[[str, dict[str, Any]], None] | None = None,
        on_child_up: Callable[[ToolServer], None] | None = None,
        needed: Callable[[str], bool] | None = None,
        owner: Caller | None = None,
        tag: str = "",
        private: bool = False,
        eras: Eras | None = None,
        on_log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.name = name
        # Log lines say which config generation a server (and its child) belongs to: after a reload the
        # old child drains beside the new one. A per-client or per-session child says whose it is, too.
        self.tag = f"{name} gen={generation}{tag}"
        self.config = config
        self.prefix = exposed_prefix(name, config)
        # Asked on every modern tool call: made once (most servers have none).
        self._task_modes = config.task_modes()
        self._cwd = str(config_dir / config.cwd) if config.cwd else None
        # `owner`: who the child's requests outside any call go to (a per-session child's session, fleet.py); `eras`:
        # what the era probe found, shared with every server of the same program (the pool's; else this one's own).
        self.dialect = dialect_for(name, config, owner, eras, era_key(name, config.argv, config.env, self._cwd))
        # One client's own child (fleet.py): its stderr's last lines reach that client when it dies during a call.
        self._private = private
        self.config_dir = config_dir
        self._on_tools_changed = on_tools_changed
        # Told (server name, the child's notification) when its resources or prompts change (surfaces.tell).
        self._on_surface_event = on_surface_event
        # Who hears the child's log lines outside any call besides the daemon's log: a per-client or per-session
        # child's owner (fleet.py).
        self._on_log = on_log
        # Told each time a new child is up (surfaces.py subscribes it again to the URIs sessions hold).
        self._on_child_up = on_child_up
        # Asked (with the server's name) whether sessions hold resource subscriptions at its child (surfaces.py): they
        # hear of changes only while a child runs, so such a child is not stopped idle, and one that exited is
        # started again (`_revive`) without waiting for a call.
        self._needed = needed
        self._revive: asyncio.Task[None] | None = None
        # Resources, templates, prompts by kind, with the connection they were listed on (a new child lists anew).
        self._surfaces: dict[str, tuple[Connection, list[dict[str, Any]]]] = {}
        self.state = State.STOPPED
        self._conn: Connection | None = None
        self._start_lock = asyncio.Lock()
        self._watch_task: asyncio.Task[None] | None = None
        self._tools: list[ToolDef] | None = None
        self._tool_names: frozenset[str] = frozenset()
        # Deadlines of the calls waiting for a slot and of those sent to the child: one loop timer for all.
        self._deadlines = Deadlines()
        self._slots = Slots(config.max_in_flight, self._deadlines, config.client_slots)
        self._waiting = 0
        # Calls that had to wait for a slot since this server was made: a rising count says max_in_flight is short.
        self.queued_total = 0
        self._active = 0
        self._last_activity = time.monotonic()
        self._crashes: list[float] = []
        self._next_start = 0.0
        self.restarts = 0
        self.last_exit: str | None = None
        self.started_at: float | None = None
        # Set when a reload replaced or removed this server: no new child starts, calls in flight may finish.
        self.retired: str | None = None
        self._quiet = asyncio.Event()
        self._quiet.set()

    # One child, shared by whoever reaches this server (a per-client or per-session one is a Fleet's, fleet.py).
    isolation = "shared"

    @property
    def protocol(self) -> str:
        """What the child speaks (its dialect's name)."""
        return self.dialect.protocol

    @property
    def processes(self) -> list[ToolServer]:
        """The servers whose children this one runs: itself."""
        return [self]

    @property
    def dormant(self) -> bool:
        """No child, and no call running or waiting: dropping this server loses nothing."""
        return self._conn is None and not self._active and not self._waiting and self.state is not State.STARTING

    def _set_tools(self, tools: list[ToolDef] | None) -> None:
        """Cache the child's tool list (None: stale) with a name index for the hot path."""
        self._tools = tools
        self._tool_names = frozenset(tool.method for tool in tools or ())

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running child's pid, if any."""
        return self._conn.pid if self._conn is not None and self._conn.alive else None

    def _touch(self) -> None:
        self._last_activity = time.monotonic()

    async def ensure_running(self) -> Connection:
        """The live connection, starting the child (and its MCP handshake) if needed."""
        conn = self._conn
        if conn is not None and conn.alive and self.state is State.RUNNING:
            return conn
        if self.retired is not None:
            raise ToolServerUnavailable(f"tool server {self.name!r} {self.retired}; retry the call",
                                        {"server": self.name})
        async with self._start_lock:
            conn = self._conn
            if conn is not None and conn.alive and self.state is State.RUNNING:
                return conn
            return await self._start()

    async def _start(self) -> Connection:
        if self.state is State.FAILED:
            raise ToolServerFailed(
                f"tool server {self.name!r} failed: it crashed {len(self._crashes)} times within "
                f"{self.config.restart_window:g}s; fix it and reload, or restart it",
                {"server": self.name, "last_exit": self.last_exit},
            )
        delay = self._next_start - time.monotonic()
        if delay > 0:
            # The backoff is bounded by BACKOFF_MAX; the caller's own deadline bounds it too.
            await asyncio.sleep(delay)
        self.state = State.STARTING
        conn = Connection(
            self.name,
            self.config.argv,
            env=self.config.env,
            cwd=self._cwd,
            on_notification=self._on_notification,
            # Bound to this very connection: a request is relayed by the calls pending on the child that sent it.
            on_request=lambda message: self.dialect.on_request(message, conn),
            on_activity=self._touch,
            on_exit=self._after_exit,
            tag=self.tag,
            deadlines=self._deadlines,
            private=self._private,
        )
        try:
            await conn.open()
            tools = await self.dialect.handshake(conn, self.tag)
            if tools is not None:
                self._set_tools(tools)
        except GatewayError as exc:
            await self._start_failed(conn, exc)
            raise
        self._conn = conn
        self.state = State.RUNNING
        self.started_at = time.time()
        self._touch()
        self._watch_task = asyncio.create_task(self._watch(conn), name=f"{self.name}-watch")
        if self._on_child_up is not None:
            self._on_child_up(self)
        return conn

    async def _start_failed(self, conn: Connection, exc: GatewayError) -> None:
        logger.warning("server=%s start failed: %s", self.tag, exc.message)
        info = await conn.close()
        self.last_exit = info.describe()
        self._record_crash()

    async def _watch(self, conn: Connection) -> None:
        """Stops the running child after `idle_timeout` of silence; ends when the child exits, idles out or is
        stopped, and then lets go of the loop timer its calls' cancelled deadlines kept (`Deadlines.release`)."""
        try:
            while True:
                if await conn.wait_exited(self._idle_wait()):
                    return
                if await self._stop_if_idle(conn):
                    return
        finally:
            self._deadlines.release()
            await self.dialect.ended(conn)

    def _idle_wait(self) -> float | None:
        """How long the child may stay silent from now; None when it never idles out."""
        idle = self.config.idle_timeout
        if not idle:
            return None
        if self._active:
            # Busy: activity is touched again when the calls end, so check back one period later.
            return idle
        return max(self._last_activity + idle - time.monotonic(), IDLE_MIN_WAIT)

    async def _stop_if_idle(self, conn: Connection) -> bool:
        if self._active or conn.in_flight or time.monotonic() - self._last_activity < self.config.idle_timeout:
            return False
        kept = self.kept_by()
        if kept:
            logger.info("server=%s pid=%d idle for %gs, kept: %s", self.tag, conn.pid, self.config.idle_timeout, kept)
            self._touch()
            return False
        async with self._start_lock:
            if self._active or self._conn is not conn:
                return False
            logger.info("server=%s pid=%d idle for %gs, stopping", self.tag, conn.pid, self.config.idle_timeout)
            self.state = State.STOPPING
            self._conn = None
        await conn.close()
        if self.state is State.STOPPING:
            self.state = State.STOPPED
        return True

    def _after_exit(self, conn: Connection) -> None:
        if self._conn is not conn:
            return
        self._conn = None
        info = conn.exit_info
        self.last_exit = info.describe() if info else None
        self._record_crash()
        if self.state is not State.FAILED:
            self.state = State.STOPPED
            if self.retired is None and self._kept() and (self._revive is None or self._revive.done()):
                self._revive = asyncio.create_task(self._revived(), name=f"{self.name}-revive")

    def kept_by(self) -> str | None:
        """Why the child runs though no call does, if something else keeps it: what it is kept for, else None."""
        return "sessions hold subscriptions at it" if self._kept() else self.dialect.keeps_child()

    def _kept(self) -> bool:
        """Whether sessions hold resource subscriptions at this server's child."""
        return self._needed is not None and self._needed(self.name)

    async def _revived(self) -> None:
        """Start a new child for the sessions that hold subscriptions at the one that exited (once its crash backoff
        has passed), as long as they do. A start that fails counts as a crash, so a child that cannot start ends
        `failed` within `max_restarts` and is not tried again."""
        while self.retired is None and self.state is not State.FAILED and self._kept():
            try:
                conn = await self.ensure_running()
            except GatewayError as exc:
                logger.warning("server=%s start for its subscribers failed: %s", self.tag, exc.message)
                continue
            logger.info("server=%s pid=%d started again: sessions hold subscriptions at it", self.tag, conn.pid)
            return

    def _record_crash(self) -> None:
        now = time.monotonic()
        window = self.config.restart_window
        self._crashes = [t for t in self._crashes if now - t < window] + [now]
        if len(self._crashes) > self.config.max_restarts:
            self.state = State.FAILED
            logger.error("server=%s crashed %d times within %gs: failed", self.tag, len(self._crashes), window)
            return
        self.state = State.STOPPED
        self.restarts += 1
        backoff = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (len(self._crashes) - 1))
        self._next_start = now + backoff
        logger.warning("server=%s will start again when next needed (a call, or its subscribers), not before %.1fs",
                       self.tag, backoff)

    def reset(self) -> None:
        """Forget crashes (admin restart or new config): a failed server may start again."""
        self._crashes.clear()
        self._next_start = 0.0
        if self.state is State.FAILED:
            self.state = State.STOPPED

    async def restart(self) -> None:
        """An admin restart: forget crashes (leaving `failed`), stop the child; the next call starts a new one (at
        once when it is eager, or sessions hold subscriptions at it)."""
        self.reset()
        await self.stop()
        if self.config.start == "eager" or self._kept():
            await self.ensure_running()

    async def retire(self, why: str, drain: float) -> None:
        """After a reload dropped or replaced this server: give calls in flight up to `drain` seconds, then
        stop the child; calls still running then fail with `why`."""
        self.retired = why
        if not self._quiet.is_set():
            logger.info("server=%s %s: draining %d calls (up to %gs)", self.tag, why, self._active + self._waiting,
                        drain)
        try:
            async with asyncio.timeout(drain):
                await self._quiet.wait()
        except TimeoutError:
            logger.warning("server=%s %s: %d calls still running after %gs fail now", self.tag, why,
                           self._active, drain)
            if self._conn is not None:
                self._conn.fail_calls(ToolServerUnavailable(
                    f"tool server {self.name!r} {why} before the call finished; retry the call",
                    {"server": self.name}))
        await self.stop()

    def _busy(self, delta_active: int, delta_waiting: int) -> None:
        self._active += delta_active
        self._waiting += delta_waiting
        if self._active or self._waiting:
            self._quiet.clear()
        else:
            self._quiet.set()

    async def stop(self) -> None:
        """Stop the child, if running, with the full escalation; calls in flight fail."""
        revive, self._revive = self._revive, None
        if revive is not None:
            revive.cancel()
            await asyncio.gather(revive, return_exceptions=True)
        async with self._start_lock:
            conn, self._conn = self._conn, None
            if self.state is not State.FAILED:
                self.state = State.STOPPING
        if conn is not None:
            await conn.close()
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        if self.state is State.STOPPING:
            self.state = State.STOPPED

    def _on_notification(self, message: dict[str, Any]) -> None:
        if self.dialect.on_notification(message):
            return
        method = message.get("method")
        if method == "notifications/tools/list_changed":
            self._set_tools(None)
            if self._on_tools_changed is not None:
                self._on_tools_changed(self.name)
        elif method in STALE_AFTER:
            for kind in STALE_AFTER[method]:
                self._surfaces.pop(kind, None)
            if self._on_surface_event is not None:
                self._on_surface_event(self.name, message)
        elif method == ELICITATION_COMPLETE and self._on_surface_event is not None:
            # For the session the elicitation was put to (elicitations.py).
            self._on_surface_event(self.name, message)
        elif method == "notifications/message":
            logger.info("server=%s log: %.500s", self.tag, message.get("params"))
            if self._on_log is not None:
                self._on_log(message)
        else:
            logger.debug("server=%s notification %s dropped", self.tag, method)

    # -- calls -----------------------------------------------------------------------------

    async def _admit(self, timeout: float, client: str) -> None:
        """Take one of `max_in_flight` slots (at most `client_slots` of them for one client), waiting in a queue of
        at most `max_queued` (`client_queue` per client); `_release` gives it back. (A pair of calls rather than a
        context manager: this is on every call's path, and contextlib's costs more.)"""
        if not self._slots.take(client):
            config = self.config
            if self._waiting >= config.max_queued or self._slots.queued_by(client) >= config.client_queue:
                raise Overloaded(
                    f"tool server {self.name!r} is busy: {self._active} calls in flight ({self._slots.held_by(client)}"
                    f" of them this client's, which may hold {config.client_slots}), {self._waiting} waiting",
                    {"server": self.name, "max_in_flight": config.max_in_flight,
                     "max_in_flight_per_client": config.client_slots},
                )
            await self._wait_for_slot(timeout, client)
        self._busy(1, 0)
        self._touch()

    def _release(self, client: str) -> None:
        self._busy(-1, 0)
        self._slots.give(client)
        self._touch()

    async def _wait_for_slot(self, timeout: float, client: str) -> None:
        self.queued_total += 1
        self._busy(0, 1)
        try:
            if not await self._slots.wait(timeout, client):
                raise Overloaded(f"tool server {self.name!r} stayed busy for {timeout:g}s", {"server": self.name})
        finally:
            self._busy(0, -1)

    def needs_confirmation(self, method: str) -> bool:
        """Whether its tools.d file says every call of `method` waits for a person."""
        return self.config.needs_confirmation(method)

    def is_dangerous(self, method: str) -> bool:
        """Whether a call of `method` may run only once its decision is durably in the audit log."""
        return self.config.is_dangerous(method)

    def task_mode(self, method: str) -> str:
        """Whether a 2026-07-28 caller's call of `method` may become a task: its tools.d `task`."""
        modes = self._task_modes
        return modes.get(self.dialect.settings_name(method), "never") if modes else "never"

    def deadline_for(self, method: str) -> float:
        """The call deadline for `method`: its tools.d timeout (under the name its dialect keeps it by), else the
        server's `call_timeout`."""
        return self.config.timeout_for(self.dialect.settings_name(method))

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        """An MCP `tools/call` of `tool`, answered as a CallToolResult."""
        conn, timeout = await self._running_in_slot(tool, delivery)
        try:
            return await self.dialect.call_tool(conn, tool, arguments, timeout, delivery)
        finally:
            self._release(delivery.client)

    async def call_method(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        """A direct call of `method`, answered with the child's own result."""
        conn, timeout = await self._running_in_slot(method, delivery)
        try:
            return await self.dialect.call_method(conn, method, params, timeout, delivery)
        finally:
            self._release(delivery.client)

    async def notify(self, method: str, params: Any, delivery: Delivery = ANYONE) -> bool:
        """Send `method` as a notification (nothing comes back); False when the dialect has none."""
        if not self.dialect.can_notify(method):
            return False
        conn, _ = await self._running_in_slot(method, delivery)
        try:
            await self.dialect.notify(conn, method, params, delivery)
        finally:
            self._release(delivery.client)
        return True

    async def roots_changed(self, session: str) -> None:
        """A shared child never holds one session's roots (fleet.py's children may): nothing to tell."""

    async def tell_roots_changed(self) -> None:
        """Tell the running child its client's roots changed, if it ever asked for them."""
        conn = self._conn
        if conn is not None and conn.alive and self.dialect.asked_roots:
            await conn.notify("notifications/roots/list_changed")

    async def _running_in_slot(self, method: str, delivery: Delivery) -> tuple[Connection, float]:
        """Hold a slot (`_release` gives it back) and the running child, for a call of `method` that may still run;
        its deadline."""
        timeout = self.deadline_for(method)
        if delivery.timeout is not None and delivery.timeout < timeout:
            timeout = delivery.timeout
        await self._admit(timeout, delivery.client)
        try:
            if delivery.still_allowed is not None:
                # A slot may have taken a while: the permission is checked again just before anything is sent.
                delivery.still_allowed()
            return await self.ensure_running(), timeout
        except BaseException:
            self._release(delivery.client)
            raise

    async def has_tool(self, method: str) -> bool:
        """Whether the server offers `method` (declared, or listed by the child)."""
        declared = self.dialect.declares(method)
        if declared is not None:
            return declared
        if self._tools is None or self._conn is None:
            await self.tools()
        return method in self._tool_names

    async def tools(self) -> list[ToolDef]:
        """The server's tools: declared in its config, or listed by the child (cached until it says they changed)."""
        declared = self.dialect.declared
        if declared is not None:
            return declared
        if self._tools is None or self._conn is None:
            conn = await self.ensure_running()
            if self._tools is None:
                self._set_tools(await self.dialect.list_tools(conn, self.tag))
        return self._tools or []

    def tools_known(self) -> list[ToolDef] | None:
        declared = self.dialect.declared
        if declared is not None:
            return declared
        return self._tools if self._conn is not None else None

    async def surface(self, kind: str) -> list[dict[str, Any]]:
        """The child's resources, templates or prompts (cached until it says they changed, or a new child runs);
        none for a protocol without them."""
        known = self.surface_known(kind)
        if known is not None:
            return known
        conn = await self.ensure_running()
        listed = await self.dialect.list_surface(conn, kind, self.tag)
        self._surfaces[kind] = (conn, listed)
        return listed

    def surface_known(self, kind: str) -> list[dict[str, Any]] | None:
        if not self.dialect.offers_surfaces:
            return NOTHING_LISTED
        cached = self._surfaces.get(kind)
        if cached is not None and cached[0] is self._conn and cached[0].alive:
            return cached[1]
        return None

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        """An MCP request about the child's resources, prompts or completions, answered with its own result."""
        conn, timeout = await self._running_in_slot(method, delivery)
        try:
            return await self.dialect.call_surface(conn, method, params, timeout, delivery)
        finally:
            self._release(delivery.client)

    def status(self) -> dict[str, Any]:
        """A snapshot for logs, the admin API and metrics."""
        return {
            "name": self.name,
            "state": str(self.state),
            "pid": self.pid,
            "protocol": self.dialect.protocol,
            "era": self.dialect.era,
            "in_flight": self._active,
            "waiting": self._waiting,
            "queued_total": self.queued_total,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "uptime_s": round(time.time() - self.started_at, 3) if self.pid and self.started_at else None,
            # What keeps a running child from its idle stop (an agent's kept terminals, held subscriptions).
            "kept_by": self.kept_by() if self.pid else None,
        }


class Slots:
    """`size` slots, at most `per_client` of them held by one client, handed to waiters in arrival order among
    those whose client may take one more; a wait is bounded by a coarse deadline.

    asyncio.Semaphore under asyncio.timeout did the same (without the shares) with a timer made and cancelled for
    every call that queued, and past `max_in_flight` in flight that is most calls. A slot freed while someone who
    may take it waits goes straight to them, so a newcomer cannot take it first. Free slots exist only while no
    waiter may take one: a waiter becomes able to only when its own client gives a slot back, and `give` then
    looks for it.
    """

    def __init__(self, size: int, deadlines: Deadlines, per_client: int | None = None) -> None:
        self._free = size
        self._per_client = per_client or size
        self._held: dict[str, int] = {}
        self._waiters: collections.deque[tuple[asyncio.Future[bool], str]] = collections.deque()
        self._queued: dict[str, int] = {}
        self._deadlines = deadlines

    @property
    def queued(self) -> int:
        """Waiters in line."""
        return len(self._waiters)

    def queued_by(self, client: str) -> int:
        """Waiters of `client` in line."""
        return self._queued.get(client, 0)

    def held_by(self, client: str) -> int:
        """Slots `client` holds."""
        return self._held.get(client, 0)

    def take(self, client: str = "") -> bool:
        """Take a slot if one is free and `client` holds fewer than its share."""
        held = self._held.get(client, 0)
        if self._free and held < self._per_client:
            self._free -= 1
            self._held[client] = held + 1
            return True
        return False

    async def wait(self, timeout: float, client: str = "") -> bool:
        """Wait in line for a slot: True once it is ours, False after `timeout` seconds without one."""
        handed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (handed, client)
        self._waiters.append(entry)
        self._queued[client] = self._queued.get(client, 0) + 1
        deadline = self._deadlines.call_later(timeout, _give_up, handed)
        try:
            return await handed
        except asyncio.CancelledError:
            if _holds_slot(handed):
                self.give(client)  # handed a slot just as the wait was cancelled: pass it on
            raise
        finally:
            deadline.cancel()
            _count_down(self._queued, client)
            if not _holds_slot(handed):
                with contextlib.suppress(ValueError):  # a waiter that gave up leaves the line (rare: O(n) is fine)
                    self._waiters.remove(entry)

    def give(self, client: str = "") -> None:
        """Give `client`'s slot back: to the first waiter who may take it, or to the free ones."""
        _count_down(self._held, client)
        for index, (waiter, who) in enumerate(self._waiters):
            if waiter.done():
                continue
            held = self._held.get(who, 0)
            if held < self._per_client:
                del self._waiters[index]
                self._held[who] = held + 1
                waiter.set_result(True)
                return
        self._drop_finished()
        self._free += 1

    def _drop_finished(self) -> None:
        while self._waiters and self._waiters[0][0].done():
            self._waiters.popleft()


def _count_down(counts: dict[str, int], client: str) -> None:
    left = counts.get(client, 0) - 1
    if left > 0:
        counts[client] = left
    else:
        counts.pop(client, None)


def _holds_slot(handed: asyncio.Future[bool]) -> bool:
    return handed.done() and not handed.cancelled() and handed.result()


def _give_up(handed: asyncio.Future[bool]) -> None:
    if not handed.done():
        handed.set_result(False)
