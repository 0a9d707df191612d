"""Reloading the config as one transaction, and what triggers it.

Owns: the triggers (a change under `tools.d/` or `policies/` seen by watchfiles, SIGHUP, and
`gatewayctl reload` on the admin socket), parsing and validating everything before anything
changes, applying a valid config as one swap (build the next generation — tokens, policies and tool
servers — then replace `state.generation`; then retire the old servers and tell open sessions and
calls waiting for approval what changed for them), the result of the last reload, and telling
systemd (RELOADING=1 … READY=1).

An invalid config changes nothing: the running one stays, the errors are logged, kept for
`gatewayctl status`, and returned to `gatewayctl reload`. An unchanged config is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatewayd import policy, systemd
from gatewayd.catalog import LIST_CHANGED
from gatewayd.config.loader import (
    POLICIES_DIR,
    TOOLS_DIR,
    ConfigInvalid,
    Snapshot,
    config_digest,
    counted,
    load_snapshot,
)
from gatewayd.generation import Generation
from gatewayd.state import DaemonState
from gatewayd.upstream.pool import PoolDiff

if TYPE_CHECKING:
    import watchfiles

logger = logging.getLogger(__name__)

# watchfiles hands over a batch of changes after this long without a new kind of change (it keeps a set, so
# the same file written again does not count as new)…
QUIET_MS = 50
# …or at most this long.
MAX_GROUP_MS = 1600
# So the reloader itself waits until the files' contents have stopped changing for SETTLE_QUIET (an editor's
# save is several writes, a deploy script may save in a loop), but at most SETTLE_MAX: one reload per burst.
# Short, since an operator waits on it: with 100 files a save was callable after 0.38-0.56 s at 0.25 (the
# goal is 0.5 s), while an editor's writes of one save land within milliseconds of each other.
SETTLE_QUIET = 0.15
SETTLE_MAX = 3.0
# How long shutdown waits for the watcher thread to notice it should stop.
WATCH_STOP_TIMEOUT = 10.0
# The watcher wakes this often with no change. On its first wake-up (its watches are in place by then) and every
# DRIFT_CHECK_INTERVAL after, the files are compared with the running config: a change made while the watches
# were being set up, or an event the filesystem never sent, is not missed for long.
WATCH_TICK_MS = 1000
DRIFT_CHECK_INTERVAL = 30.0


@dataclass(frozen=True)
class NamesDiff:
    """Names added, removed or changed between two configs (clients, roles, operators)."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    @classmethod
    def between(cls, old: dict[str, Any], new: dict[str, Any]) -> NamesDiff:
        return cls(sorted(set(new) - set(old)), sorted(set(old) - set(new)),
                   sorted(name for name in set(old) & set(new) if old[name] != new[name]))

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


@dataclass(frozen=True)
class ReloadResult:
    """What one reload did, for the log, `gatewayctl reload` and `gatewayctl status`."""

    ok: bool
    trigger: str
    generation: int
    changed: bool = False
    errors: list[str] = field(default_factory=list)
    servers: PoolDiff = field(default_factory=PoolDiff)
    clients: NamesDiff = field(default_factory=NamesDiff)
    roles: NamesDiff = field(default_factory=NamesDiff)
    operators: NamesDiff = field(default_factory=NamesDiff)
    scrapers: NamesDiff = field(default_factory=NamesDiff)
    at: float = field(default_factory=time.time)

    def view(self) -> dict[str, Any]:
        """JSON for the admin API."""
        names = ("added", "removed", "changed")
        return {
            "ok": self.ok, "trigger": self.trigger, "generation": self.generation, "changed": self.changed,
            "errors": self.errors, "at": self.at,
            "servers": {key: getattr(self.servers, key) for key in (*names, "unchanged")},
            **{kind: {key: getattr(getattr(self, kind), key) for key in names}
               for kind in ("clients", "roles", "operators", "scrapers")},
        }


class Reloader:
    """The one way to replace the running config generation."""

    def __init__(self, state: DaemonState, drain: float) -> None:
        self.state = state
        self.drain = drain
        self.last: ReloadResult | None = None
        self.failures = 0
        self._lock = asyncio.Lock()
        self._requests: asyncio.Queue[str] = asyncio.Queue()
        # Read by the watcher's thread at every step (QUIET_MS).
        self._stop_watching = threading.Event()
        # Digest of the files a reload last refused: a periodic check does not retry the same broken files.
        self._refused_digest: str | None = None
        # Whether the files on disk were the running config when last checked (check_sync).
        self.in_sync = True
        self._next_drift_check = 0.0

    @property
    def snapshot(self) -> Snapshot:
        """The running config."""
        return self.state.generation.snapshot

    @property
    def config_dir(self) -> Path:
        return self.snapshot.config_dir

    @property
    def generation(self) -> int:
        """The running config's generation: 1 at start, one more per applied reload (its servers carry it in
        their log lines)."""
        return self.state.generation.number

    @property
    def reloads(self) -> int:
        """Reloads applied so far."""
        return self.generation - 1

    def request(self, trigger: str) -> None:
        """Ask for a reload from a signal handler; `serve_requests` carries it out."""
        self._requests.put_nowait(trigger)

    async def serve_requests(self) -> None:
        """Carry out requested reloads (SIGHUP) one at a time, forever."""
        while True:
            await self.reload(await self._requests.get())

    async def reload(self, trigger: str) -> ReloadResult:
        """Read, validate and apply the config directory. Never raises for a bad config: the result says."""
        async with self._lock:
            systemd.notify("RELOADING=1", systemd.monotonic_usec(), f"STATUS=reloading ({trigger})")
            try:
                result = await self._reload(trigger)
            finally:
                systemd.notify("READY=1", f"STATUS={self._status_line()}")
            self.last = result
            return result

    async def _reload(self, trigger: str) -> ReloadResult:
        try:
            # Reading files is blocking I/O: off the event loop.
            snapshot = await asyncio.to_thread(load_snapshot, self.config_dir)
        except ConfigInvalid as exc:
            self.failures += 1
            self._refused_digest = await asyncio.to_thread(config_digest, self.config_dir)
            errors = [str(error) for error in exc.errors]
            for line in errors:
                logger.error("reload (%s) refused, generation %d stays: %s", trigger, self.generation, line)
            return ReloadResult(False, trigger, self.generation, errors=errors)
        if snapshot.digest == self.snapshot.digest:
            logger.info("reload (%s): config unchanged, generation %d stays", trigger, self.generation)
            return ReloadResult(True, trigger, self.generation)
        result = self._apply(snapshot, trigger)
        logger.info("reload (%s): generation %d applied: %s", trigger, self.generation, _summary(result))
        return result

    def _apply(self, snapshot: Snapshot, trigger: str) -> ReloadResult:
        """Build the next generation, swap it in (one reference: no request sees half of it), retire the old."""
        state = self.state
        old = state.generation
        new, servers = old.next(snapshot, state.pool)
        state.generation = new
        state.pool.switched(old.servers, new.servers, self.drain)
        self._update_sessions(old, new, servers)
        self._recheck_approvals(new)
        return ReloadResult(True, trigger, new.number, changed=True, servers=servers,
                            clients=NamesDiff.between(old.snapshot.clients, snapshot.clients),
                            roles=NamesDiff.between(old.snapshot.roles, snapshot.roles),
                            operators=NamesDiff.between(old.snapshot.operators, snapshot.operators),
                            scrapers=NamesDiff.between(old.snapshot.scrapers, snapshot.scrapers))

    def _update_sessions(self, old: Generation, new: Generation, servers: PoolDiff) -> None:
        """Sessions of removed clients end; those whose tool list may differ are told at once."""
        sessions = self.state.sessions
        for session in sessions.all():
            before, after = old.principal(session.client), new.principal(session.client)
            if after is None:
                logger.info("session of removed client %s ended by the reload", session.client)
                sessions.delete(session.id)
                continue
            principals = [p for p in (before, after) if p is not None]
            visible = any(policy.may_see_server(p, name) for p in principals for name in servers.touched)
            if visible or before is None or before.grants != after.grants:
                session.push(LIST_CHANGED)

    def _recheck_approvals(self, new: Generation) -> None:
        """A call waiting for approval whose permission the reload removed will never run."""
        approvals = self.state.approvals
        for approval in approvals.pending():
            principal = new.principal(approval.client)
            allowed = principal is not None and policy.decide(principal, approval.method, approval.arguments,
                                                             confirm_required=True).decision is not policy.Decision.DENY
            if not allowed:
                approvals.withdraw(approval, "a config reload removed the permission")

    # -- status ------------------------------------------------------------------------------

    async def check_sync(self) -> bool:
        """Compare the files on disk with the running config now; remembered in `in_sync`."""
        on_disk = await asyncio.to_thread(config_digest, self.config_dir)
        self.in_sync = on_disk == self.snapshot.digest
        return self.in_sync

    async def status(self) -> dict[str, Any]:
        """Generation, digest, whether the files on disk still match, and the last reload's result."""
        return {
            "generation": self.generation, "digest": self.snapshot.digest, "in_sync": await self.check_sync(),
            "config_dir": str(self.config_dir), "reloads": self.reloads, "reload_failures": self.failures,
            "last_reload": self.last.view() if self.last else None,
        }

    def _status_line(self) -> str:
        # Where it serves stays in the line: `systemctl status` after a reload still says it.
        servers = len(self.state.generation.servers)
        line = f"serving {self.state.links.describe()}: generation {self.generation}, {counted(servers, 'tool server')}"
        if self.last is not None and not self.last.ok:
            return f"{line}; last reload FAILED"
        return line

    # -- watching files ----------------------------------------------------------------------

    async def watch(self) -> None:
        """Reload when files under tools.d/ or policies/ change, until `stop_watching`. Follows a symlinked
        tools.d/ or policies/ being swapped to another directory. A watcher that fails is logged, not fatal."""
        try:
            await self._watch()
        except Exception as exc:  # inotify limits, a vanished directory: the daemon serves on without watching
            logger.error("watching %s failed (%s); reload with SIGHUP or gatewayctl reload", self.config_dir, exc)

    async def _watch(self) -> None:
        while not self._stop_watching.is_set():
            targets = self._watch_targets()
            self._next_drift_check = 0.0  # a new watcher's first tick compares the files: nothing slips in between
            watcher = await asyncio.to_thread(self._watcher, targets)
            stepping = False
            try:
                while True:
                    stepping = True
                    changes = await asyncio.to_thread(next, watcher, None)
                    stepping = False
                    if changes is None:
                        return  # told to stop
                    if not changes:
                        await self._check_drift()
                    else:
                        names = sorted({os.path.basename(path) for _, path in changes})
                        await self._settle()
                        await self.reload(f"files changed: {', '.join(names)[:200]}")
                    if self._watch_targets() != targets:
                        logger.info("config directories moved: watching the new ones")
                        break
            finally:
                if stepping:
                    # Cancelled mid-step: told to stop, the thread's step ends within QUIET_MS and the watch with it.
                    self._stop_watching.set()
                else:
                    watcher.close()

    async def _settle(self) -> None:
        """Return once the config files have not changed for SETTLE_QUIET, or after SETTLE_MAX."""
        deadline = time.monotonic() + SETTLE_MAX
        previous = await asyncio.to_thread(config_digest, self.config_dir)
        while time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_QUIET)  # a debounce timer: the files get time to stop changing
            current = await asyncio.to_thread(config_digest, self.config_dir)
            if current == previous:
                return
            previous = current

    async def _check_drift(self) -> None:
        now = time.monotonic()
        if now < self._next_drift_check:
            return
        self._next_drift_check = now + DRIFT_CHECK_INTERVAL
        on_disk = await asyncio.to_thread(config_digest, self.config_dir)
        if on_disk not in (self.snapshot.digest, self._refused_digest):
            await self.reload("files differ from the running config")

    async def stop_watching(self, watcher: asyncio.Task[None]) -> None:
        """End `watch` (its thread polls the stop event), bounded."""
        self._stop_watching.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(WATCH_STOP_TIMEOUT):
                await watcher
        if not watcher.done():
            watcher.cancel()

    def _watch_targets(self) -> list[str]:
        # The config directory itself sees tools.d/ or policies/ replaced (a symlink swap, a rename);
        # the resolved directories see the files. Not recursive: only their own *.toml files count.
        # A config directory that is itself a symlink (/etc/gatewayd -> releases/42) is swapped in its parent.
        targets = [os.path.realpath(self.config_dir)]
        if os.path.islink(self._config_link):
            targets.append(os.path.dirname(self._config_link))
        for name in (TOOLS_DIR, POLICIES_DIR):
            real = os.path.realpath(self.config_dir / name)
            if os.path.isdir(real):
                targets.append(real)
        return targets

    @property
    def _config_link(self) -> str:
        return os.path.abspath(self.config_dir)

    def _watcher(self, targets: list[str]) -> Generator[set[tuple[watchfiles.Change, str]], None, None]:
        """watchfiles' synchronous generator, to be stepped in a worker thread: its async twin runs on anyio, whose
        socket module imports ssl, which the daemon otherwise never loads (see lean_import). Imported here, in the
        worker thread, not with this module: a daemon that does not watch never loads watchfiles and anyio, and one
        that does loads them beside its first calls instead of before it listens."""
        import watchfiles

        return watchfiles.watch(*targets, watch_filter=self._relevant, debounce=MAX_GROUP_MS, step=QUIET_MS,
                                stop_event=self._stop_watching, recursive=False, rust_timeout=WATCH_TICK_MS,
                                yield_on_timeout=True, raise_interrupt=False)

    def _relevant(self, _change: watchfiles.Change, path: str) -> bool:
        name = os.path.basename(path)
        if path == self._config_link:
            return True
        if name in (TOOLS_DIR, POLICIES_DIR):
            return os.path.dirname(path) == os.path.realpath(self.config_dir)
        # Editor swap and backup files (.x.swp, x~, .#x, 4913) and anything not *.toml are not config.
        return name.endswith(".toml") and not name.startswith(".") and self._in_config(path)

    def _in_config(self, path: str) -> bool:
        parent = os.path.dirname(path)
        return any(parent == os.path.realpath(self.config_dir / name) or parent == str(self.config_dir / name)
                   for name in (TOOLS_DIR, POLICIES_DIR))


def _summary(result: ReloadResult) -> str:
    parts = [f"servers {kind} {', '.join(names)}" for kind in ("added", "removed", "changed")
             if (names := getattr(result.servers, kind))]
    for kind in ("clients", "roles", "operators", "scrapers"):
        diff: NamesDiff = getattr(result, kind)
        if diff:
            parts.append(f"{kind} changed")
    return "; ".join(parts) or "no server changed"
