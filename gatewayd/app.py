"""Composition root: load config → pool → gateway → HTTP; wait for a signal; ordered shutdown.

Owns the daemon's lifetime and the order things start and stop in. Shutdown: stop
accepting, end session streams, let calls in flight finish (bounded by `shutdown_grace`),
then stop every tool server with the full escalation, so no child outlives the daemon.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web

from gatewayd import admin, systemd
from gatewayd.audit import AuditLog
from gatewayd.config.loader import Snapshot, load_snapshot
from gatewayd.gateway import Gateway
from gatewayd.reloader import Reloader
from gatewayd.sessions import Sessions
from gatewayd.settings import Settings
from gatewayd.upstream.pool import Pool
from gatewayd.upstream.server import State
from gatewayd.web import console
from gatewayd.web.app import MCP_PATH, create_app
from gatewayd.web.auth import TokenTable
from gatewayd.web.limits import ConnectionLimits, LimitedRunner
from gatewayd.web.mcp_http import WebState

logger = logging.getLogger(__name__)


def _bound_port(runner: web.AppRunner) -> int:
    address = runner.addresses[0]
    return int(address[1])


def build(settings: Settings, snapshot: Snapshot) -> WebState:
    """Wire pool, gateway, sessions and tokens for one snapshot; nothing is started yet."""
    sessions = Sessions(settings.max_sessions, settings.session_idle_timeout)
    pool = Pool(snapshot, on_tools_changed=lambda name: gateway.tools_changed(name))
    gateway = Gateway(pool, settings.tool_name_separator, sessions, AuditLog(settings.audit_file()))
    return WebState(settings, gateway, sessions, TokenTable(snapshot))


def observe(state: WebState, reloader: Reloader) -> None:
    """Wire the metrics: gauges read from their owners at each scrape, served by /metrics and the admin socket."""
    gateway = state.gateway

    def gauges() -> Iterable[tuple[str, str, dict[str, str], float]]:
        servers = list(gateway.pool.servers.values())
        for name in State:
            yield ("gatewayd_servers", "Tool servers by state.", {"state": name.value},
                   sum(1 for server in servers if server.state is name))
        children = [s for s in [*servers, *gateway.pool.retiring] if s.pid is not None]
        yield "gatewayd_children_running", "Tool server processes running (retiring ones too).", {}, len(children)
        for server in servers:
            yield ("gatewayd_server_restarts_total", "Restarts after a crash, by server.", {"server": server.name},
                   server.restarts)
            status = server.status()
            yield ("gatewayd_server_calls_in_flight", "Calls running on each server.", {"server": server.name},
                   status["in_flight"])
        yield "gatewayd_sessions", "Open MCP sessions.", {}, len(state.sessions)
        yield "gatewayd_pending_approvals", "Calls waiting for a person's confirmation.", {}, len(gateway.approvals)
        yield "gatewayd_reloads_total", "Config reloads applied.", {}, reloader.reloads
        yield "gatewayd_reload_failures_total", "Config reloads refused (invalid config).", {}, reloader.failures
        yield "gatewayd_config_generation", "Generation of the running config.", {}, reloader.generation
        yield ("gatewayd_config_in_sync", "1 when the files on disk are the running config.", {},
               1 if reloader.in_sync else 0)
        yield "gatewayd_audit_healthy", "1 while the audit log can be written.", {}, 1 if gateway.audit.healthy else 0
        yield from _collector_gauges()

    gateway.metrics.add_gauges(gauges)

    async def text() -> str:
        await reloader.check_sync()
        return gateway.metrics.render()

    state.metrics = text


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


def listen_on(state: WebState, port: int) -> None:
    """Accept the Host and Origin values that belong to the port we actually listen on; say where the approval
    page is."""
    state.hosts = frozenset(state.settings.hosts(port))
    state.origins = frozenset(state.settings.origins(port))
    if state.settings.approval_page:
        state.gateway.approval_url = f"http://{_url_host(state.settings.host)}:{port}{console.PAGE_PATH}"


def make_runner(state: WebState) -> web.AppRunner:
    """The aiohttp runner, with the connection limits (limits.py) and aiohttp's own header limits. Handlers
    are not cancelled when a client goes away: a dropped SSE stream is not a cancellation in MCP 2025, and
    calls end by their own deadlines."""
    settings = state.settings
    return LimitedRunner(create_app(state), limits=ConnectionLimits.from_settings(settings),
                         shutdown_timeout=settings.shutdown_grace, handler_cancellation=False, access_log=None,
                         keepalive_timeout=settings.keepalive_timeout, max_line_size=settings.max_line_bytes,
                         max_field_size=settings.max_header_bytes, max_headers=settings.max_headers)


async def serve(settings: Settings, on_ready: Callable[[str], None] | None = None) -> None:
    """Run the daemon until SIGTERM or SIGINT. Raises ConfigInvalid before listening if the config is bad."""
    snapshot = load_snapshot(settings.config_dir)
    state = build(settings, snapshot)
    pool, sessions, audit_log = state.gateway.pool, state.sessions, state.gateway.audit
    await audit_log.start()
    runner = make_runner(state)
    await runner.setup()
    reloader = Reloader(state, snapshot, settings.reload_drain)
    observe(state, reloader)
    admin_runner = AdminSocket(state, reloader)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Log rotation: rename the audit file, then SIGUSR1 makes the daemon write to a new one.
    loop.add_signal_handler(signal.SIGUSR1, audit_log.reopen)
    loop.add_signal_handler(signal.SIGHUP, reloader.request, "SIGHUP")
    try:
        site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
        await site.start()
        port = _bound_port(runner)
        listen_on(state, port)
        url = f"http://{_url_host(settings.host)}:{port}{MCP_PATH}"
        await admin_runner.start(settings)
        # What start-up made (imports, config, the app: ~50,000 objects, none garbage) lives as long as the daemon.
        # Out of the cyclic collector's sight, a full run of it under load takes ~0.5 ms instead of ~15 ms, a
        # stall of every call in flight.
        gc.freeze()
        logger.info("listening on %s (%d tool servers, %d clients)", url, len(pool.servers), len(snapshot.clients))
        if on_ready is not None:
            on_ready(url)
        systemd.notify("READY=1", f"STATUS=serving {url}: {len(pool.servers)} tool servers")
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(pool.start_eager(), name="eager-start")
            background = [tasks.create_task(reloader.serve_requests(), name="reload-requests")]
            watchdog = _start_watchdog(tasks)
            if watchdog is not None:
                background.append(watchdog)
            watcher = tasks.create_task(reloader.watch(), name="config-watch") if settings.watch_config else None
            await stop.wait()
            logger.info("stopping")
            systemd.notify("STOPPING=1", "STATUS=stopping: draining calls")
            if watcher is not None:
                await reloader.stop_watching(watcher)
            for task in background:
                task.cancel()
    finally:
        await admin_runner.stop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        sessions.broadcast_close()
        # aiohttp shields running handlers from its own shutdown timeout, so the gateway drains its calls itself.
        await state.gateway.drain(settings.shutdown_grace)
        await runner.cleanup()
        await pool.stop_all()
        # Last, so the outcomes of calls that finished while draining are written.
        await audit_log.close()
        logger.info("stopped")


def _start_watchdog(tasks: asyncio.TaskGroup) -> asyncio.Task[None] | None:
    interval = systemd.watchdog_interval()
    if interval is None:
        return None
    logger.info("systemd watchdog: pinging every %.3gs", interval)
    return tasks.create_task(systemd.watchdog(interval), name="watchdog")


class AdminSocket:
    """The admin API's listener on its unix socket (admin.py), if the settings name one."""

    def __init__(self, state: WebState, reloader: Reloader) -> None:
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


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
