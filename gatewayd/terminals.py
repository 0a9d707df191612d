"""Terminals an ACP agent runs through the gateway (`terminal/*`), once its policy allowed them.

Owns the processes behind one set of terminals (a turn's, or an agent session's when tools.d says
`terminal_lifetime = "session"`): started without a shell, in a process group of their own, stdin closed,
stdout and stderr together into an output buffer kept to the last `outputByteLimit` bytes (at most
MAX_OUTPUT_BYTES, cut at a character boundary, as ACP asks); their exit status; killing a group; and
ending them all at once (`close`: the turn's end, or the session's agent gone). At most MAX_TERMINALS a set.
Does not own deciding whether a command may run (agents.py: `SERVER.terminal/create` through the policy,
a person and the audit log), nor how long a set lives (upstream/acp.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from gatewayd.errors import InvalidParams, Overloaded

logger = logging.getLogger(__name__)

# Terminals one turn (or one agent session) may hold at once.
MAX_TERMINALS = 8
# Output kept for one terminal when the agent asks for more (or says nothing).
MAX_OUTPUT_BYTES = 1024 * 1024
# How much a terminal's reader takes from its pipe at a time.
READ_CHUNK = 65536
# A killed group is waited for this long before the terminal is given up on (SIGKILL cannot be refused).
KILL_WAIT = 5.0
# Once a command has exited, what it wrote last is waited for this long (a grandchild may hold the pipe open).
DRAIN_WAIT = 1.0
# What a terminal's process inherits of the daemon's environment, as tool servers do (the rest it is given).
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")


@dataclass(eq=False)
class Terminal:
    """One running (or finished) command and what it wrote."""

    process: asyncio.subprocess.Process
    limit: int
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    reader: asyncio.Task[None] | None = None

    def take(self, chunk: bytes) -> None:
        self.output += chunk
        if len(self.output) > self.limit:
            cut = len(self.output) - self.limit
            # Never start inside a UTF-8 character: skip its continuation bytes.
            while cut < len(self.output) and (self.output[cut] & 0xC0) == 0x80:
                cut += 1
            del self.output[:cut]
            self.truncated = True

    def exit_status(self) -> dict[str, Any] | None:
        code = self.process.returncode
        if code is None:
            return None
        if code < 0:
            return {"exitCode": None, "signal": signal.Signals(-code).name}
        return {"exitCode": code, "signal": None}


class Terminals:
    """The terminals of one turn or one agent session, by the gateway's own ids."""

    def __init__(self) -> None:
        self._terminals: dict[str, Terminal] = {}
        self._ids = itertools.count(1)

    async def create(self, params: dict[str, Any]) -> dict[str, Any]:
        """Start the command the (already decided) request names; its terminal id."""
        if len(self._terminals) >= MAX_TERMINALS:
            raise Overloaded(f"at most {MAX_TERMINALS} terminals at once: release one first")
        command, args, cwd = params.get("command"), params.get("args") or [], params.get("cwd")
        if not isinstance(command, str) or not command or not isinstance(args, list) \
                or not all(isinstance(arg, str) for arg in args):
            raise InvalidParams("terminal/create needs params.command, a string, and args, strings")
        if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
            raise InvalidParams("terminal/create params.cwd must be an absolute path")
        limit = params.get("outputByteLimit")
        limit = min(limit, MAX_OUTPUT_BYTES) if isinstance(limit, int) and limit >= 0 else MAX_OUTPUT_BYTES
        try:
            process = await asyncio.create_subprocess_exec(
                command, *args, cwd=cwd, env=_environment(params.get("env")), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise InvalidParams(f"terminal/create: {command}: {exc.strerror}") from None
        terminal = Terminal(process, limit)
        terminal.reader = asyncio.get_running_loop().create_task(_read(terminal), name=f"terminal-{process.pid}")
        terminal_id = f"term-{next(self._ids)}"
        self._terminals[terminal_id] = terminal
        logger.info("terminal %s pid=%d started: %.200s", terminal_id, process.pid, " ".join([command, *args]))
        return {"terminalId": terminal_id}

    async def handle(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """`terminal/output`, `wait_for_exit`, `kill` or `release` of one of these terminals."""
        terminal_id = params.get("terminalId")
        terminal = self._terminals.get(terminal_id) if isinstance(terminal_id, str) else None
        if terminal is None:
            raise InvalidParams(f"{method}: unknown terminal {str(terminal_id)[:64]!r}")
        if method == "terminal/output":
            if terminal.process.returncode is not None and terminal.reader is not None:
                # Everything it wrote before it ended.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(terminal.reader), DRAIN_WAIT)
            output = terminal.output.decode("utf-8", "replace")
            return {"output": output, "truncated": terminal.truncated, "exitStatus": terminal.exit_status()}
        if method == "terminal/wait_for_exit":
            await terminal.process.wait()
            status = terminal.exit_status()
            assert status is not None
            return status
        if method == "terminal/kill":
            await _kill(terminal)
            return {}
        if method == "terminal/release":
            del self._terminals[str(terminal_id)]
            await _kill(terminal)
            return {}
        raise InvalidParams(f"{method} is not a terminal method")

    def __len__(self) -> int:
        return len(self._terminals)

    def running(self) -> int:
        """How many of these terminals' commands have not exited."""
        return sum(terminal.process.returncode is None for terminal in self._terminals.values())

    def kill(self) -> None:
        """Signal every terminal's group at once, without waiting (`close` then waits for them)."""
        for terminal in self._terminals.values():
            _signal(terminal)

    async def close(self) -> None:
        """Every terminal is killed and forgotten: each group is signalled before the first wait, so a close cut
        short (its owner cancelled) has still ended them all."""
        self.kill()
        terminals, self._terminals = list(self._terminals.values()), {}
        await asyncio.gather(*(_reap(terminal) for terminal in terminals), return_exceptions=True)


def _environment(requested: Any) -> dict[str, str]:
    env = {name: os.environ[name] for name in INHERITED if name in os.environ}
    if isinstance(requested, list):
        for item in requested:
            if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("value"), str):
                env[item["name"]] = item["value"]
    return env


async def _read(terminal: Terminal) -> None:
    stream = terminal.process.stdout
    assert stream is not None
    while chunk := await stream.read(READ_CHUNK):
        terminal.take(chunk)


async def _kill(terminal: Terminal) -> None:
    _signal(terminal)
    await _reap(terminal)


def _signal(terminal: Terminal) -> None:
    # The whole group, even after its leader ended: nothing it started outlives the terminal.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(terminal.process.pid, signal.SIGKILL)


async def _reap(terminal: Terminal) -> None:
    """Wait for a signalled terminal's command to end and its output to be read (at most KILL_WAIT)."""
    process = terminal.process
    try:
        async with asyncio.timeout(KILL_WAIT):
            await process.wait()
            if terminal.reader is not None:
                await terminal.reader
    except TimeoutError:
        logger.warning("terminal pid=%d did not end within %gs of SIGKILL", process.pid, KILL_WAIT)
