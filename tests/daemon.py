"""Test harness: write a config directory, start the real daemon on a free loopback port, stop it.

The daemon runs as a subprocess (`python -m gatewayd`), exactly as an operator runs it; its
URL is read from its own "listening on" log line. Every wait here has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token

REPO = Path(__file__).resolve().parent.parent
FAULTSRV = REPO / "tests" / "fixtures" / "faultsrv.py"
# Time for the daemon to log that it listens; generous for a loaded 2-core CI machine.
START_DEADLINE = 20.0
# Time for the daemon to stop with its children after SIGTERM.
STOP_DEADLINE = 20.0
LISTENING = re.compile(r"listening on (http://\S+)")


def write_config(
    root: Path, servers: dict[str, str], roles: str = "", clients: dict[str, list[str]] | None = None
) -> dict[str, str]:
    """Create `root/tools.d/<name>.toml` for each server and a policy; return {client: token}."""
    (root / "tools.d").mkdir(parents=True, exist_ok=True)
    (root / "policies").mkdir(parents=True, exist_ok=True)
    for name, text in servers.items():
        (root / "tools.d" / f"{name}.toml").write_text(text)
    (root / "policies" / "roles.toml").write_text(roles)
    tokens: dict[str, str] = {}
    for client, client_roles in (clients or {}).items():
        tokens[client] = new_token()
        set_client_token(root / "policies" / "clients.toml", client, hash_token(tokens[client]), client_roles)
    return tokens


def python_command(*args: str) -> str:
    """A TOML `command = [...]` running this interpreter, so children import this checkout."""
    return "command = [" + ", ".join(f'"{part}"' for part in (sys.executable, *args)) + "]"


def faultsrv_command(*flags: str) -> str:
    """A TOML `command` for the fault-injecting fixture server."""
    return python_command(str(FAULTSRV), *flags)


def daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the daemon: this interpreter's bin first, so `python3` is this venv's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEWAYD_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


class Daemon:
    """The real daemon as a subprocess. `async with Daemon(dir) as d:` then use `d.url`."""

    def __init__(self, config_dir: Path, *args: str, env: dict[str, str] | None = None,
                 program: tuple[str, ...] | None = None, cwd: Path | None = None) -> None:
        self.config_dir = config_dir
        self.args = args
        self.env = env
        # How the daemon is started (None: `sys.executable -m gatewayd`, read at start), and where: an installed copy
        # is started by its own script, from anywhere.
        self.program = program
        self.cwd = cwd or config_dir
        self.url = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.logs: list[str] = []
        self._drain: asyncio.Task[None] | None = None
        self.log_event = asyncio.Event()

    async def __aenter__(self) -> Daemon:
        self.proc = await asyncio.create_subprocess_exec(
            *(self.program or (sys.executable, "-m", "gatewayd")), "--config-dir", str(self.config_dir), "--port", "0",
            *self.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=daemon_env(self.env),
            cwd=str(self.cwd),
        )
        self._drain = asyncio.create_task(self._read_logs())
        try:
            async with asyncio.timeout(START_DEADLINE):
                while not self.url:
                    if self.proc.returncode is not None or self._drain.done():  # stderr closed: it is exiting
                        await self.proc.wait()
                        raise RuntimeError("daemon exited:\n" + "\n".join(self.logs))
                    self.log_event.clear()
                    await self.log_event.wait()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _read_logs(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.logs.append(text)
            if not self.url and (match := LISTENING.search(text)):
                self.url = match.group(1)
            self.log_event.set()
        self.log_event.set()

    async def wait_log(self, pattern: str, timeout: float = 10.0) -> str:
        """The first log line matching `pattern`, waiting for it up to `timeout`."""
        regex = re.compile(pattern)
        async with asyncio.timeout(timeout):
            while True:
                for line in self.logs:
                    if regex.search(line):
                        return line
                self.log_event.clear()
                await self.log_event.wait()

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Signal the daemon and wait for it to exit; returns its exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            async with asyncio.timeout(STOP_DEADLINE):
                code = await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        if self._drain is not None:
            await asyncio.gather(self._drain, return_exceptions=True)
        return code

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def headers(token: str, **extra: str) -> dict[str, str]:
    """Request headers for a JSON-RPC POST with a bearer token."""
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **extra}


async def rpc(
    http: aiohttp.ClientSession, url: str, token: str, method: str, params: Any = None, *, id: Any = 1,
    **extra_headers: str,
) -> dict[str, Any]:
    """One JSON-RPC request; the decoded JSON response."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    async with http.post(url, json=message, headers=headers(token, **extra_headers)) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


# Time one gatewayctl run may take.
GATEWAYCTL_DEADLINE = 30.0


async def gatewayctl(config_dir: Path, *args: str) -> tuple[int, str, str]:
    """Run the real `gatewayctl --config-dir DIR ARGS…`: (exit status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "gatewayctl"), "--config-dir", str(config_dir), *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=daemon_env(), cwd=str(config_dir),
    )
    async with asyncio.timeout(GATEWAYCTL_DEADLINE):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def status(config_dir: Path) -> dict[str, Any]:
    """What the real `gatewayctl status --json` shows of the running daemon."""
    code, out, err = await gatewayctl(config_dir, "status", "--json")
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)
    return shown


async def pending_approvals(config_dir: Path, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Poll `gatewayctl approvals --json` until at least `count` calls wait; their views, oldest first."""
    async with asyncio.timeout(timeout):
        while True:
            code, out, err = await gatewayctl(config_dir, "approvals", "--json")
            assert code == 0, err
            pending: list[dict[str, Any]] = json.loads(out)
            if len(pending) >= count:
                return pending
