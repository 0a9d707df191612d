"""Minimal MCP stdio server exposing one tool, ``run``: ``python3 -m gatewayd.examples.shell``.

Owns running a shell command for a tool call: its own process group (so timeout and cancellation kill
everything it started), output streamed line by line as progress and log notifications, a capped
result. The MCP handshake, dispatch and cancellation bookkeeping come from ``_mcpstdio``.
"""

from __future__ import annotations

import enum
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

from gatewayd.examples._mcpstdio import (
    CallContext,
    JsonObject,
    McpServer,
    Tool,
    ToolArgumentError,
    check_known_arguments,
    optional_number,
    optional_string,
    require_string,
    text_result,
)

SERVER_NAME: Final = "gatewayd-shell"
SERVER_VERSION: Final = "0.1.0"
LOGGER_NAME: Final = "shell.run"
SHELL: Final = "/bin/sh"

DEFAULT_TIMEOUT_SECONDS: Final = 60.0
MAX_TIMEOUT_SECONDS: Final = 3600.0
MAX_OUTPUT_BYTES: Final = 1 << 20  # output kept in the result; the rest is counted, not kept
MAX_LINE_BYTES: Final = 64 * 1024  # longer lines are streamed in pieces so one line cannot pin memory
READ_CHUNK_BYTES: Final = 64 * 1024
# Background jobs that inherit stdout would otherwise hold the call open until the timeout.
POST_EXIT_DRAIN_SECONDS: Final = 2.0
# Only used where pidfd_open is unavailable and process exit must be polled for.
EXIT_POLL_SECONDS: Final = 0.05

RUN_INPUT_SCHEMA: Final[JsonObject] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "Shell command line, run with /bin/sh -c"},
        "cwd": {"type": "string"},
        "timeout": {"type": "number", "description": "seconds, default 60"},
    },
    "required": ["command"],
    "additionalProperties": False,
}


class Outcome(enum.Enum):
    EXITED = "exited"
    TIMED_OUT = "timed out"
    CANCELLED = "cancelled"


class RunningCommand:
    """A started command's process group; killing and reaping are serialised so a late kill can never
    hit a recycled process id."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self._lock = threading.Lock()
        self._reaped = False

    def kill_group(self) -> None:
        with self._lock:
            if self._reaped:
                return
            try:
                # start_new_session made the shell a group leader, so its pid is the group id.
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def has_exited(self) -> bool:
        # WNOWAIT leaves the zombie in place so the pid stays reserved until reap().
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.process.pid, flags) is not None

    def reap(self) -> int:
        """Wait for the shell and return its status the way a shell reports it (128 + signal)."""
        with self._lock:
            code = self.process.wait()
            self._reaped = True
        return code if code >= 0 else 128 - code


class OutputCollector:
    """Splits output into lines for streaming and keeps the first MAX_OUTPUT_BYTES for the result."""

    def __init__(self, emit_line: Callable[[int, str], None]) -> None:
        self._emit_line = emit_line
        self._pending = bytearray()
        self._kept = bytearray()
        self.omitted_bytes = 0
        self.line_count = 0

    def feed(self, chunk: bytes) -> None:
        room = MAX_OUTPUT_BYTES - len(self._kept)
        self._kept += chunk[:room]
        self.omitted_bytes += max(0, len(chunk) - room)
        self._pending += chunk
        while (newline := self._pending.find(b"\n")) >= 0:
            self._emit(self._pending[:newline])
            del self._pending[: newline + 1]
        while len(self._pending) >= MAX_LINE_BYTES:
            self._emit(self._pending[:MAX_LINE_BYTES])
            del self._pending[:MAX_LINE_BYTES]

    def finish(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending.clear()

    def output(self) -> str:
        return self._kept.decode("utf-8", errors="replace")

    def _emit(self, raw: bytearray) -> None:
        self.line_count += 1
        self._emit_line(self.line_count, raw.decode("utf-8", errors="replace").removesuffix("\r"))


def _exit_watch_fd(pid: int) -> int | None:
    """A pidfd that becomes readable when the process exits, so exits need no polling."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def pump_output(
    running: RunningCommand, collector: OutputCollector, deadline: float, cancelled: threading.Event
) -> Outcome:
    """Stream the command's output until it has exited and its output closed, it times out, or it is
    cancelled (cancellation kills the group, which wakes the select through EOF or the exit fd)."""
    stdout = running.process.stdout
    assert stdout is not None  # started with stdout=PIPE
    out_fd = stdout.fileno()
    exit_fd = _exit_watch_fd(running.process.pid)
    out_open = True
    exited_at: float | None = None
    try:
        while True:
            if cancelled.is_set():
                return Outcome.CANCELLED
            now = time.monotonic()
            if exited_at is None and exit_fd is None and running.has_exited():
                exited_at = now
            if exited_at is not None and (not out_open or now >= exited_at + POST_EXIT_DRAIN_SECONDS):
                return Outcome.EXITED
            if now >= deadline:
                return Outcome.TIMED_OUT
            limit = deadline if exited_at is None else min(deadline, exited_at + POST_EXIT_DRAIN_SECONDS)
            wait = limit - now
            if exited_at is None and exit_fd is None:
                wait = min(wait, EXIT_POLL_SECONDS)
            watched = [out_fd] if out_open else []
            if exit_fd is not None and exited_at is None:
                watched.append(exit_fd)
            ready, _, _ = select.select(watched, [], [], wait)
            if out_fd in ready:
                chunk = os.read(out_fd, READ_CHUNK_BYTES)
                out_open = bool(chunk)
                collector.feed(chunk)
            if exit_fd is not None and exit_fd in ready:
                exited_at = time.monotonic()
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _start(command: str, cwd: str | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [SHELL, "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _timeout_argument(arguments: JsonObject) -> float:
    timeout = optional_number(arguments, "timeout")
    if timeout is None:
        return DEFAULT_TIMEOUT_SECONDS
    if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise ToolArgumentError(
            f"Invalid arguments: 'timeout' must be > 0 and <= {MAX_TIMEOUT_SECONDS:g} seconds"
        )
    return timeout


def _result(collector: OutputCollector, outcome: Outcome, exit_code: int, timeout: float) -> JsonObject:
    output = collector.output()
    structured: JsonObject = {"exit_code": exit_code, "output": output}
    text = output
    if collector.omitted_bytes:
        text += f"\n[output truncated: {collector.omitted_bytes} more bytes not shown]"
        structured["truncated"] = True
    if outcome is Outcome.TIMED_OUT:
        text += f"\n[timed out after {timeout:g} s; process group killed]"
        structured["timed_out"] = True
    else:
        text += f"\n[exit status {exit_code}]"
    return text_result(text, is_error=outcome is Outcome.TIMED_OUT or exit_code != 0, structured=structured)


def run_tool(arguments: JsonObject, context: CallContext) -> JsonObject:
    check_known_arguments(arguments, RUN_INPUT_SCHEMA["properties"])
    command = require_string(arguments, "command")
    cwd = optional_string(arguments, "cwd")
    timeout = _timeout_argument(arguments)
    if cwd is not None and not os.path.isdir(cwd):
        return text_result(f"cwd is not a directory: {cwd}", is_error=True)
    deadline = time.monotonic() + timeout
    try:
        running = RunningCommand(_start(command, cwd))
    except OSError as exc:
        return text_result(f"Could not start {SHELL}: {exc}", is_error=True)
    context.on_cancel(running.kill_group)

    def emit_line(number: int, line: str) -> None:
        context.report_progress(number, message=line)
        context.log("info", LOGGER_NAME, line)

    collector = OutputCollector(emit_line)
    outcome = Outcome.CANCELLED  # what an unexpected failure while pumping is treated as
    try:
        outcome = pump_output(running, collector, deadline, context.cancelled)
        collector.finish()
    finally:
        if running.process.stdout is not None:
            running.process.stdout.close()
        if outcome is not Outcome.EXITED:
            running.kill_group()
    return _result(collector, outcome, running.reap(), timeout)


RUN_TOOL: Final = Tool(
    name="run",
    description=(
        "Run a shell command with /bin/sh -c and return its combined stdout/stderr and exit status. "
        "Output lines are streamed as progress and log notifications while it runs."
    ),
    input_schema=RUN_INPUT_SCHEMA,
    handler=run_tool,
    annotations={"destructiveHint": True},
    blocking=True,
)


def main() -> int:
    return McpServer(SERVER_NAME, SERVER_VERSION, [RUN_TOOL]).serve()


if __name__ == "__main__":
    sys.exit(main())
