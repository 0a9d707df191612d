"""Processes under test: spawn a server, wait for its "listening on" line, stop it; read /proc.

Owns every server subprocess the benchmark starts (the floors, gatewayd, the child), the Python they
run on (`install_copy`: gatewayd installed in a venv as pip installs it for production, not the
checkout's editable install), the environment they run in (that venv's bin first on PATH, so
`python3` in tools.d is the same interpreter), the config directory gatewayd is given, and the /proc
readings: RSS, peak RSS, CPU time, children.
Every wait has a deadline; readiness is the server's own log line, never a sleep.
"""

from __future__ import annotations

import asyncio
import collections
import compileall
import contextlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gatewayd
from bench.wire import SERVER_NAME
from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token

# Time for a server to log that it listens; generous for a loaded 2-core machine.
START_DEADLINE = 20.0
# Time for a server to exit after SIGTERM before it is killed.
STOP_DEADLINE = 20.0
# Stderr lines kept for error reports.
LOG_TAIL_LINES = 200
LISTENING = re.compile(r"listening on (http://\S+)")
CLIENT = "bench"
ROLE = "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Making the venv of the installed copy (no pip, no download) takes a second or two.
INSTALL_DEADLINE = 120.0
# The interpreter every server and child runs on: this one until install_copy() sets the installed copy's.
_python = Path(sys.executable)


def install_copy(root: Path, source: Path | None = None) -> Path:
    """A venv under `root` with the gatewayd package installed as a wheel installs it (copied into site-packages,
    byte-compiled) and this venv's site-packages as a plain path for the dependencies; every server, the floor
    included, then runs on it. The checkout's editable install would add its import hook to every process
    start (~25 ms each, for the daemon and again for each child), which no production install has.
    `source`: another copy of the package to install (bench.ab); the servers' default Python stays the first
    copy's. Returns the venv's python."""
    global _python
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=INSTALL_DEADLINE)
    site = next((venv / "lib").glob("python*/site-packages"))
    package = source if source is not None else Path(gatewayd.__file__).parent
    shutil.copytree(package, site / "gatewayd", ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(str(site / "gatewayd"), quiet=1)
    (site / "bench-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    if source is None:
        _python = python
    return python


def interpreter() -> dict[str, Any]:
    """This Python (the driver's and, through install_copy, every server's): version, and how it was built.
    The build matters: on pyenv's default build (libpython as a shared library, no profile-guided optimisation)
    the daemon and its child spent 10–25% more CPU per call here than on Debian's python3.11."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        shared = any("libpython" in line for line in maps)
    return {
        "executable": sys.executable,
        "base_executable": getattr(sys, "_base_executable", sys.executable),
        "version": platform.python_version(),
        "libpython_shared": shared,
        "config_args": sysconfig.get_config_var("CONFIG_ARGS") or "",
    }


KIB = 1024

ECHO_TOML = """\
# The plain JSON-RPC example server, with only the method the benchmark calls.
command = ["python3", "-m", "gatewayd.examples.calc"]
protocol = "jsonrpc"

[methods.echo]
description = "Return the arguments unchanged"
input_schema = { type = "object" }
"""
ROLES_TOML = f'[roles.{ROLE}]\nallow = ["{SERVER_NAME}.*"]\n'


def bench_env(extra: dict[str, str] | None = None, python: Path | None = None) -> dict[str, str]:
    """This environment with the servers' interpreter's bin first on PATH and no GATEWAYD_* overrides."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEWAYD_")}
    env["PATH"] = f"{(python or _python).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def write_config(root: Path) -> str:
    """Write tools.d/echo.toml and a policy allowing `echo.*` to one client; return its token."""
    (root / "tools.d").mkdir(parents=True, exist_ok=True)
    (root / "policies").mkdir(parents=True, exist_ok=True)
    (root / "tools.d" / f"{SERVER_NAME}.toml").write_text(ECHO_TOML)
    (root / "policies" / "roles.toml").write_text(ROLES_TOML)
    token = new_token()
    set_client_token(root / "policies" / "clients.toml", CLIENT, hash_token(token), [ROLE])
    return token


def daemon_argv(config_dir: Path, extra: list[str] | None = None, python: Path | None = None) -> list[str]:
    """The daemon as an operator runs it, on a free loopback port, plus `extra` settings (bench --daemon-arg)."""
    # One client drives all the load, so the per-client rate and concurrency limits are lifted; the audit
    # log stays on, as it is by default.
    return [str(python or _python), "-m", "gatewayd", "--config-dir", str(config_dir), "--port", "0",
            "--host", "127.0.0.1",
            "--client-rate", "1000000", "--client-burst", "1000000", "--client-max-concurrent", "4096",
            *(extra or [])]


def floor_argv(module: str = "bench.floor") -> list[str]:
    """A floor (`bench.floor`, the HTTP floor, or `bench.relay`, the relay floor) on a free loopback port."""
    return [str(_python), "-m", module, "--host", "127.0.0.1", "--port", "0"]


class ServerProcess:
    """A server subprocess that logs "listening on http://…" on stderr. `await start()`, then `url`, then `stop()`."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.url = ""
        self.spawned_at = 0.0
        self.listening_at = 0.0
        self.logs: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    @property
    def pid(self) -> int:
        """The server's pid."""
        assert self._proc is not None, "start() first"
        return self._proc.pid

    async def start(self) -> str:
        """Spawn the server and wait for its "listening on" line; returns its URL."""
        self.spawned_at = time.perf_counter()
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=str(self.cwd) if self.cwd else None,
        )
        self._drain = asyncio.create_task(self._read_logs(), name=f"{self.name}-logs")
        try:
            async with asyncio.timeout(START_DEADLINE):
                await self._ready.wait()
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"{self.name} did not log 'listening on' within {START_DEADLINE:g}s:\n"
                               + "\n".join(self.logs)) from None
        if not self.url:
            await self.stop()
            raise RuntimeError(f"{self.name} exited before listening:\n" + "\n".join(self.logs))
        return self.url

    async def _read_logs(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        while line := await self._proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.logs.append(text)
            if not self.url and (match := LISTENING.search(text)):
                self.listening_at = time.perf_counter()
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()

    async def stop(self) -> float:
        """SIGTERM the server and wait for it (SIGKILL after STOP_DEADLINE); returns the seconds it took."""
        started = time.perf_counter()
        proc = self._proc
        if proc is None:
            return 0.0
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_DEADLINE):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._drain is not None:
            await asyncio.gather(self._drain, return_exceptions=True)
        return time.perf_counter() - started


# -- /proc ---------------------------------------------------------------------------------


def status_kib(pid: int, field: str) -> int:
    """A numeric field of /proc/PID/status (VmRSS, VmHWM, … in KiB; Threads, a count); 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, grandchildren, …)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as children:
                    kids = [int(kid) for kid in children.read().split()]
            except OSError:
                continue
            found.extend(kids)
            stack.extend(kids)
    return found


def zombies(pids: list[int]) -> int:
    """How many of `pids` have exited and wait to be reaped (state Z in /proc/PID/stat)."""
    count = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                count += stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
    return count


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    return [pid, *descendants(pid)]


def rss_kib(pids: list[int]) -> int:
    """Summed resident set size of `pids`, KiB."""
    return sum(status_kib(pid, "VmRSS") for pid in pids)


def cpu_seconds(pids: list[int]) -> float:
    """Summed user + system CPU time of `pids` so far (processes that are gone count 0)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Fields after the command name: state is [0], utime [11], stime [12].
        ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


@dataclass
class Peak:
    """The largest RSS seen by a sampler, KiB: the process alone and with its descendants."""

    process_kib: int = 0
    tree_kib: int = 0


class MemorySampler:
    """Samples a process's RSS (alone and with its descendants) every `interval` seconds while running."""

    def __init__(self, pid: int, interval: float) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = Peak()
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """Take one sample now."""
        own = status_kib(self.pid, "VmRSS")
        total = own + rss_kib(descendants(self.pid))
        self.peak.process_kib = max(self.peak.process_kib, own)
        self.peak.tree_kib = max(self.peak.tree_kib, total)

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        """Begin sampling in the background."""
        self._task = asyncio.create_task(self._run(), name=f"rss-{self.pid}")

    async def stop(self) -> Peak:
        """Stop sampling (taking a last sample); the peaks seen."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.sample()
        return self.peak
