"""Composition root: the `Daemon` — built from settings and a config, started, stopped — and `serve`.

Owns wiring the daemon's parts together (state.py holds them), the order they start in, and the
order they stop in: stop accepting (the TCP listener and the admin socket), end session streams,
let calls in flight finish (bounded by `shutdown_grace`), close connections, then stop every tool
server with the full escalation, so no child outlives the daemon; the audit log closes last.
`serve` adds what belongs to the process: signals, systemd, and freezing the start-up heap. The
in-process test stack runs the very same `Daemon`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from gatewayd import admin, elicitations, surfaces, systemd, tasks
from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.catalog import Catalog, tell_tools_changed
from gatewayd.config.loader import Snapshot, load_snapshot
from gatewayd.confirmation import ConfirmationGate
from gatewayd.continuations import Continuations
from gatewayd.gateway import Gateway
from gatewayd.generation import Generation
from gatewayd.inflight import Inflight
from gatewayd.metrics import Metrics
from gatewayd.paging import Pager
from gatewayd.records import Records
from gatewayd.relay import Relay
from gatewayd.reloader import Reloader
from gatewayd.sessions import Sessions
from gatewayd.settings import Settings
from gatewayd.state import DaemonState
from gatewayd.surfaces import Surfaces
from gatewayd.upstream.pool import Pool
from gatewayd.upstream.server import State
from gatewayd.urls import MCP_PATH
from gatewayd.web.app import DIRECT_ROUTES, create_app
from gatewayd.web.limits import ConnectionLimits, LimitedRunner, fit_open_file_limit, limit_loop_error_reports

logger = logging.getLogger(__name__)

# Objects made and not yet freed between two runs of the cyclic collector's youngest generation (Python's default:
# 700). With 32 calls in flight that many are always alive, so the collector ran every ~40 calls, found nothing to
# free (a call's objects are freed by their reference counts) and took ~170 µs each time.
COLLECTOR_YOUNG = 10_000


class Daemon:
    """gatewayd in one object: `start()` listens and starts the background work, `stop()` ends it all in order.

    Construction wires everything for the config the daemon starts with (ConfigInvalid if it is bad) and
    starts nothing.
    """

    def __init__(self, settings: Settings, snapshot: Snapshot | None = None) -> None:
        self.settings = settings
        self.state = _build(settings, snapshot if snapshot is not None else load_snapshot(settings.config_dir))
        self.reloader = Reloader(self.state, settings.reload_drain)
        _observe(self.state, self.reloader)
        self.url = ""
        self._runner = make_runner(self.state)
        self._site: web.TCPSite | None = None
        self._serving = False
        self._stopped = False
        self._admin = AdminSocket(self.state, self.reloader)
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: asyncio.Task[None] | None = None
        # Set when background work the daemon cannot do without ends with an error: `serve` stops then.
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def start(self) -> str:
        """Open the audit log, listen on HTTP and on the admin socket, start the background work; the URL."""
        settings, state = self.settings, self.state
        limit_loop_error_reports()
        fit_open_file_limit(self._runner, len(state.generation.servers))
        await state.audit.start()
        await self._runner.setup()
        self._serving = True
        self._site = web.TCPSite(self._runner, settings.host, settings.port, reuse_address=True)
        await self._site.start()
        port = int(self._runner.addresses[0][1])
        _listen_on(state, port)
        self.url = state.url = state.links.local + MCP_PATH
        await self._admin.start(settings)
        self._spawn(state.pool.start_eager(state.generation.servers), "eager-start")
        self._spawn(self.reloader.serve_requests(), "reload-requests")
        self._spawn(state.sessions.sweep(), "session-expiry")
        interval = systemd.watchdog_interval()
        if interval is not None:
            logger.info("systemd watchdog: pinging every %.3gs", interval)
            self._spawn(systemd.watchdog(interval), "watchdog")
        if settings.watch_config:
            self._watcher = self._spawn(self.reloader.watch(), "config-watch")
        logger.info("listening on %s (%s)", state.links.describe(), state.generation.snapshot.summary())
        return self.url

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None and not self.failed.done():
            logger.error("%s failed: %r", task.get_name(), error)
            self.failed.set_result(error)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, end session streams, give calls in flight `grace` seconds (default: the setting
        `shutdown_grace`), close connections, stop every child."""
        if self._stopped:
            return
        self._stopped = True
        state = self.state
        if self._watcher is not None:
            await self.reloader.stop_watching(self._watcher)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            if self._site is not None:
                await self._site.stop()
            await self._admin.stop()
            state.sessions.broadcast_close()
            # Calls parked for their callers' answers, and tasks, have nobody waiting on them: ended first, each child
            # told (a task's outcome would be lost with the daemon anyway).
            state.continuations.abandon_parked()
            state.modern_tasks.close()
            # aiohttp shields running handlers from its own shutdown timeout, so the gateway drains its calls itself.
            await state.inflight.drain(self.settings.shutdown_grace if grace is None else grace)
            # Approvals whose calls would have been sent again are withdrawn, and recorded so, before the log closes.
            await state.gateway.gate.close()
            # The rest of those calls end, each child told, before the children stop.
            await state.continuations.close()
            if self._serving:
                await self._runner.cleanup()
        finally:
            await state.gateway.surfaces.close()
            await state.pool.stop_all(state.generation.servers)
            # Last, so the outcomes of calls that finished while draining, or just now, are written.
            await state.gateway.records.close()
        logger.info("stopped")


def _build(settings: Settings, snapshot: Snapshot) -> DaemonState:
    """Wire the parts for the first generation of `snapshot`; nothing is started yet."""
    sessions = Sessions(settings.max_sessions, settings.session_idle_timeout, settings.max_sessions_per_client)
    pool = Pool(on_tools_changed=lambda name: tell_tools_changed(sessions, state.generation.tokens, name),
                on_surface_event=lambda name, message: told(name, message),
                max_isolated_children=settings.max_isolated_children,
                on_child_up=lambda server: gateway.surfaces.child_up(server),
                needed=lambda name: gateway.surfaces.holds(name), on_client_log=sessions.hear)

    def told(name: str, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method == tasks.STATUS:
            gateway.tasks.tell(name, message, state.generation.tokens.principal)
        elif method == elicitations.COMPLETE:
            gateway.relay.url_elicitations.completed(name, message)
        else:
            surfaces.tell(sessions, state.generation.tokens, name, message)

    audit_log = AuditLog(settings.audit_file(), reserve_bytes=settings.audit_reserve_bytes)
    metrics, registry, inflight = Metrics(), Approvals(), Inflight()
    records = Records(audit_log, metrics)
    catalog = Catalog(settings.tool_name_separator, settings.tool_name_max_chars, settings.tool_name_dots)
    owners = Surfaces(catalog, lambda client: state.generation.principal(client), lambda: state.generation.servers)
    gateway = Gateway(catalog, records, ConfirmationGate(registry, records), inflight, owners,
                      Relay(records, settings.relay_timeout), Pager(settings.list_page_size))
    state = DaemonState(settings, Generation.first(snapshot, pool), pool, gateway, sessions, registry, inflight,
                        audit_log, metrics, continuations=Continuations(records, settings.relay_timeout))
    return state


def _observe(state: DaemonState, reloader: Reloader) -> None:
    """Wire the metrics: gauges read from their owners at each scrape, served by /metrics and the admin socket."""

    def gauges() -> Iterable[tuple[str, str, dict[str, str], float]]:
        servers = list(state.generation.servers.values())
        for name in State:
            yield ("gatewayd_servers", "Tool servers by state.", {"state": name.value},
                   sum(1 for server in servers if server.state is name))
        children = [p for s in [*servers, *state.pool.retiring] for p in s.processes if p.pid is not None]
        yield "gatewayd_children_running", "Tool server processes running (retiring ones too).", {}, len(children)
        for server in servers:
            yield ("gatewayd_server_restarts_total", "Restarts after a crash, by server.", {"server": server.name},
                   server.restarts)
            status = server.status()
            yield ("gatewayd_server_calls_in_flight", "Calls running on each server.", {"server": server.name},
                   status["in_flight"])
            yield ("gatewayd_server_calls_waiting", "Calls waiting for one of a server's max_in_flight slots.",
                   {"server": server.name}, status["waiting"])
            yield ("gatewayd_server_calls_queued_total", "Calls that had to wait for a slot, by server (a rising "
                   "count says its max_in_flight is short for its load).", {"server": server.name},
                   status["queued_total"])
        yield "gatewayd_sessions", "Open MCP sessions.", {}, len(state.sessions)
        yield "gatewayd_pending_approvals", "Calls waiting for a person's confirmation.", {}, len(state.approvals)
        tasks = state.modern_tasks.status()
        yield "gatewayd_tasks_running", "Tasks of MCP 2026-07-28 callers whose calls still run.", {}, tasks["running"]
        yield "gatewayd_tasks_kept", "Tasks of MCP 2026-07-28 callers kept, ended or not.", {}, tasks["kept"]
        yield "gatewayd_reloads_total", "Config reloads applied.", {}, reloader.reloads
        yield "gatewayd_reload_failures_total", "Config reloads refused (invalid config).", {}, reloader.failures
        yield "gatewayd_config_generation", "Generation of the running config.", {}, reloader.generation
        yield ("gatewayd_config_in_sync", "1 when the files on disk are the running config.", {},
               1 if reloader.in_sync else 0)
        yield "gatewayd_audit_healthy", "1 while the audit log can be written.", {}, 1 if state.audit.healthy else 0
        audit = state.audit.status()
        yield ("gatewayd_audit_space_low", "1 while the audit disk's free space is below audit_reserve_bytes "
               "(ordinary records are dropped).", {}, 1 if audit["space_low"] else 0)
        yield ("gatewayd_audit_records_failed_total", "Audit records not written (disk, queue, or space).", {},
               audit["records_failed"])
        yield from _collector_gauges()

    state.metrics.add_gauges(gauges)

    async def text() -> str:
        await reloader.check_sync()
        return state.metrics.render()

    state.metrics_text = text


def _collector_gauges() -> Iterable[tuple[str, str, dict[str, str], float]]:
    """Python's cyclic collector, named as Prometheus' own Python client names it. Everything a call makes should
    be freed by its reference count: objects the collector frees are reference cycles, and its runs stall the loop."""
    yield "python_gc_frozen_objects", "Objects made at start-up, left out of the collector's runs.", {}, \
        gc.get_freeze_count()
    for generation, stats in enumerate(gc.get_stats()):
        labels = {"generation": str(generation)}
        yield "python_gc_collections_total", "Runs of the cyclic garbage collector, by generation.", labels, \
            stats["collections"]
        yield ("python_gc_objects_collected_total", "Objects only the cyclic collector could free, by generation.",
               labels, stats["collected"])


def _listen_on(state: DaemonState, port: int) -> None:
    """Accept the Host and Origin values that belong to the port we actually listen on (and the public URL's);
    say where the approval page is, as clients reach it."""
    state.hosts = frozenset(state.settings.hosts(port))
    state.origins = frozenset(state.settings.origins(port))
    state.links = state.settings.links(port)
    if state.settings.approval_page:
        state.gateway.gate.approval_url = state.links.approval_page


def make_runner(state: DaemonState) -> web.AppRunner:
    """The aiohttp runner, with the connection limits (limits.py) and aiohttp's own header limits. Handlers
    are not cancelled when a client goes away: a dropped SSE stream is not a cancellation in MCP 2025, and
    calls end by their own deadlines."""
    settings = state.settings
    return LimitedRunner(create_app(state), limits=ConnectionLimits.from_settings(settings),
                         shutdown_timeout=settings.shutdown_grace, handler_cancellation=False, access_log=None,
                         direct=DIRECT_ROUTES,
                         keepalive_timeout=settings.keepalive_timeout, max_line_size=settings.max_line_bytes,
                         max_field_size=settings.max_header_bytes, max_headers=settings.max_headers)


async def serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """Run the daemon until SIGTERM or SIGINT. Raises ConfigInvalid before listening if the config is bad."""
    daemon = Daemon(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Log rotation: rename the audit file, then SIGUSR1 makes the daemon write to a new one.
    loop.add_signal_handler(signal.SIGUSR1, daemon.state.audit.reopen)
    loop.add_signal_handler(signal.SIGHUP, daemon.reloader.request, "SIGHUP")
    try:
        url = await daemon.start()
        # What start-up made (imports, config, the app: ~50,000 objects, none garbage) lives as long as the daemon.
        # Out of the cyclic collector's sight, a full run of it under load takes ~0.5 ms instead of ~15 ms, a
        # stall of every call in flight.
        gc.freeze()
        gc.set_threshold(COLLECTOR_YOUNG, *gc.get_threshold()[1:])
        if on_ready is not None:
            on_ready(url)
        servers = len(daemon.state.generation.servers)
        systemd.notify("READY=1", f"STATUS=serving {daemon.state.links.describe()}: "
                                  f"{servers} tool server{'' if servers == 1 else 's'}")
        failed = await _first(stop.wait(), daemon.failed)
        logger.info("stopping")
        systemd.notify("STOPPING=1", "STATUS=stopping: draining calls")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await daemon.stop()
    if isinstance(failed, BaseException):
        raise failed


async def _first(stopped: Coroutine[Any, Any, Any], failed: asyncio.Future[BaseException]) -> object:
    """Wait for a stop signal or for background work to fail; the failure, if that came first."""
    waiter = asyncio.ensure_future(stopped)
    try:
        await asyncio.wait([waiter, failed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
    return failed.result() if failed.done() else None


class AdminSocket:
    """The admin API's listener on its unix socket (admin.py), if the settings name one."""

    def __init__(self, state: DaemonState, reloader: Reloader) -> None:
        self._state = state
        self._reloader = reloader
        self._runner: web.AppRunner | None = None
        self._path: Path | None = None

    async def start(self, settings: Settings) -> None:
        path = settings.admin_socket_path()
        if path is None:
            logger.info("admin socket disabled")
            return
        admin.prepare_socket(path)
        app = admin.create_app(self._state, self._reloader)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Bound with no access for group and others; the configured mode is applied right after.
        old_umask = os.umask(0o177)
        try:
            await web.UnixSite(self._runner, str(path)).start()
        finally:
            os.umask(old_umask)
        self._path = path
        admin.secure_socket(path, int(settings.admin_socket_mode, 8), settings.admin_socket_group)
        logger.info("admin socket: %s", path)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
