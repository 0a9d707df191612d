"""One stdio child process: spawn, line framing, id remapping, pending calls, shutdown escalation.

Owns: the process (in its own process group), its stdin/stdout/stderr, the gateway's own
request ids toward it, the table of calls waiting for an answer, and the ordered stop.
Does not own: MCP handshakes, restarts or idle timers (server.py), or who may call (policy.py).

Every call in flight fails at once when the child exits; a response with an unknown id, or
a stdout line that is not JSON, is logged and dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatewayd import jsonrpc
from gatewayd.deadlines import Deadlines
from gatewayd.errors import CallTimedOut, GatewayError, ToolServerUnavailable, UpstreamError

logger = logging.getLogger(__name__)

# A child's message may be this large; asyncio's 64 KiB default breaks real tool servers.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Grace period for the child to exit on its own after its stdin closes.
STDIN_CLOSE_GRACE = 2.0
# Grace period after SIGTERM before the whole process group is killed.
SIGTERM_GRACE = 3.0
# Bound on waiting for the kernel to reap a SIGKILLed group.
SIGKILL_GRACE = 2.0
# How often to check whether leftover group members (grandchildren) are gone.
GROUP_POLL_INTERVAL = 0.02
# Stderr lines kept for error reports when the child exits.
STDERR_TAIL_LINES = 20
# Stderr lines logged per window before the rest are counted, not logged.
STDERR_LOG_BURST = 50
STDERR_LOG_WINDOW = 1.0
# A few child variables a tool server usually needs; everything else must be set in its config.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR", "VIRTUAL_ENV")

EventSink = Callable[[dict[str, Any]], None]


@dataclass
class PendingCall:
    """A request sent to the child and waiting for its answer."""

    method: str
    future: asyncio.Future[Any]
    on_event: EventSink | None
    started: float = field(default_factory=time.monotonic)


@dataclass
class ExitInfo:
    """How a child ended, for errors and logs."""

    returncode: int | None
    stderr_tail: list[str]

    def describe(self) -> str:
        """'exit status N' or 'killed by signal S'."""
        code = self.returncode
        if code is None:
            return "unknown status"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit status {code}"


class _StderrLog:
    """Logs a child's stderr at a bounded rate so a flooding child cannot drown the daemon's log."""

    def __init__(self, tag: str, pid: int) -> None:
        self.tag = tag
        self.pid = pid
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._window_start = 0.0
        self._in_window = 0
        self._suppressed = 0

    def line(self, text: str) -> None:
        self.tail.append(text)
        now = time.monotonic()
        if now - self._window_start >= STDERR_LOG_WINDOW:
            if self._suppressed:
                logger.warning("server=%s pid=%d stderr: %d lines not logged (rate limit)",
                               self.tag, self.pid, self._suppressed)
            self._window_start, self._in_window, self._suppressed = now, 0, 0
        self._in_window += 1
        if self._in_window <= STDERR_LOG_BURST:
            logger.info("server=%s pid=%d stderr: %s", self.tag, self.pid, text)
        else:
            self._suppressed += 1


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: a few inherited variables plus the server's own `env`."""
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    env.update(extra)
    return env


class Connection:
    """A running stdio child speaking newline-delimited JSON-RPC. Use `open()`, then `call`/`notify`, then `close()`.

    `on_notification` receives notifications that belong to no call; `on_activity` is called on
    any output so idle detection follows what the child does, not wall time; `on_exit` is called
    once the child has exited, before the calls pending on it fail.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
        on_activity: Callable[[], None] | None = None,
        on_exit: Callable[[Connection], None] | None = None,
        tag: str | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.name = name
        # How log lines name this child: the server and the config generation it was started for.
        self.tag = tag or name
        self.argv = argv
        self.env = child_env(env or {})
        self.cwd = cwd
        self._on_notification = on_notification
        self._on_activity = on_activity
        self._on_exit = on_exit
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, PendingCall] = {}
        self._next_id = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stderr: _StderrLog | None = None
        self._exited = asyncio.Event()
        self.exit_info: ExitInfo | None = None
        self._closing = False
        self._outbox: list[bytes] = []
        self._stdout: Lines | None = None
        # The calls' deadlines: one loop timer for many calls, not one per call.
        self._deadlines = deadlines or Deadlines()

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        assert self._proc is not None, "open() first"
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the child is running and not being stopped."""
        return self._proc is not None and not self._exited.is_set() and not self._closing

    @property
    def in_flight(self) -> int:
        """Calls waiting for an answer."""
        return len(self._pending)

    async def open(self) -> None:
        """Spawn the child in its own process group. Raises ToolServerUnavailable if it cannot start."""
        assert self._proc is None, "a Connection is opened once"
        loop = asyncio.get_running_loop()
        self._stdout = Lines(self._stdout_data, self._overlong_line)
        try:
            transport, protocol = await loop.subprocess_exec(
                functools.partial(_ChildProtocol, self._stdout, loop),
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ToolServerUnavailable(
                f"tool server {self.name!r} could not start: {exc.strerror or exc}",
                {"server": self.name, "command": self.argv},
            ) from exc
        self._proc = asyncio.subprocess.Process(transport, protocol, loop)
        self._stderr = _StderrLog(self.tag, self._proc.pid)
        logger.info("server=%s pid=%d started: %s", self.tag, self._proc.pid, " ".join(self.argv))
        self._tasks = [
            asyncio.create_task(self._read_stderr(), name=f"{self.name}-stderr"),
            asyncio.create_task(self._wait_exit(), name=f"{self.name}-wait"),
        ]

    async def wait_exited(self, timeout: float | None) -> bool:
        """Whether the child exits (and its pending calls have failed) within `timeout` seconds (None: ever)."""
        return await _wait_event(self._exited, timeout)

    # -- sending ---------------------------------------------------------------------------

    def _write(self, message: dict[str, Any]) -> None:
        """Queue one line for the child. Lines queued in the same loop turn go out in one write: one
        syscall and one wake-up of the child instead of one per call (measured: the pipe write was the
        largest single cost of a call under load)."""
        if not self.alive or self._proc is None or self._proc.stdin is None:
            raise self._unavailable("is not running")
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(jsonrpc.dumps(message) + b"\n")

    def _flush(self) -> None:
        lines, self._outbox = self._outbox, []
        if self._proc is None or self._proc.stdin is None or self._proc.stdin.is_closing():
            return
        self._proc.stdin.write(b"".join(lines))

    def _backlogged(self) -> bool:
        """Whether bytes wait for the child's stdin: only then can a drain have anything to wait for."""
        stdin = self._proc.stdin if self._proc is not None else None
        return stdin is not None and stdin.transport.get_write_buffer_size() > 0

    async def _drain(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            await self._proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise self._unavailable("closed its stdin") from exc

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification; nothing comes back."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._write(message)
        await self._drain()

    def new_id(self) -> int:
        """Reserve the gateway's next request id toward this child (also usable as a progress token)."""
        self._next_id += 1
        return self._next_id

    async def call(
        self,
        method: str,
        params: Any,
        *,
        timeout: float,
        on_event: EventSink | None = None,
        request_id: int | None = None,
        cancel_on_timeout: bool = False,
    ) -> Any:
        """Send a request and wait for its result.

        Raises UpstreamError (the child's own error), CallTimedOut, or ToolServerUnavailable.
        On timeout or cancellation the call is forgotten and, if `cancel_on_timeout`, the child
        gets `notifications/cancelled`.
        """
        call_id = request_id if request_id is not None else self.new_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": call_id, "method": method}
        if params is not None:
            message["params"] = params
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write(message)
        self._pending[call_id] = PendingCall(method, future, on_event)
        # The deadline fails the future itself, rather than a timeout scope around the await (measurably cheaper).
        deadline = self._deadlines.call_later(timeout, _expire, future)
        try:
            if self._backlogged():
                await self._drain()
            return await future
        except _Expired:
            if cancel_on_timeout:
                await self._send_cancel(call_id, "timed out")
            raise CallTimedOut(
                f"tool server {self.name!r} did not answer {method} within {timeout:g}s",
                {"server": self.name, "method": method, "timeout": timeout},
            ) from None
        except asyncio.CancelledError:
            if cancel_on_timeout:
                await asyncio.shield(self._send_cancel(call_id, "cancelled by the client"))
            raise
        finally:
            deadline.cancel()
            self._pending.pop(call_id, None)

    async def _send_cancel(self, call_id: int, reason: str) -> None:
        if not self.alive:
            return
        with contextlib.suppress(ToolServerUnavailable):
            await self.notify("notifications/cancelled", {"requestId": call_id, "reason": reason})

    # -- receiving -------------------------------------------------------------------------

    def _stdout_data(self, lines: list[bytes]) -> None:
        """Whole lines as they arrive, handled in the pipe's own callback."""
        self._activity()
        for line in lines:
            try:
                self._handle_line(line)
            except Exception:  # a bug must not end the pipe, and with it every later answer of the child
                logger.exception("server=%s pid=%d stdout line not handled", self.tag, self.pid)

    def _overlong_line(self) -> None:
        self._activity()
        logger.warning("server=%s pid=%d stdout line over %d bytes dropped", self.tag, self.pid, MAX_LINE_BYTES)

    def _activity(self) -> None:
        if self._on_activity is not None:
            self._on_activity()

    def _handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("server=%s pid=%d stdout is not JSON, dropped: %.200r", self.tag, self.pid, line)
            return
        if not isinstance(message, dict):
            logger.warning("server=%s pid=%d stdout message is not an object, dropped", self.tag, self.pid)
            return
        if "method" in message:
            self._handle_incoming(message)
        elif "id" in message:
            self._handle_response(message)
        else:
            logger.warning("server=%s pid=%d message with neither method nor id dropped", self.tag, self.pid)

    def _handle_response(self, message: dict[str, Any]) -> None:
        call_id = message.get("id")
        pending = self._pending.get(call_id) if isinstance(call_id, int) else None
        if pending is None or pending.future.done():
            logger.warning("server=%s pid=%d response with unknown id %.64r dropped", self.tag, self.pid, call_id)
            return
        if "error" in message and isinstance(message["error"], dict):
            pending.future.set_exception(UpstreamError(message["error"]))
        elif "result" in message:
            pending.future.set_result(message["result"])
        else:
            pending.future.set_exception(
                self._unavailable("sent a response with neither result nor error", retryable=False)
            )

    def _handle_incoming(self, message: dict[str, Any]) -> None:
        if "id" in message:
            # A child may ping us; other requests (roots/list, sampling, …) are not relayed yet: refuse them so
            # the child does not wait.
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
            if message.get("method") == "ping":
                reply["result"] = {}
            else:
                reply["error"] = {"code": -32601, "message": "Method not found"}
            with contextlib.suppress(ToolServerUnavailable):
                self._write(reply)
            return
        sink = self._sink_for(message)
        if sink is not None:
            sink(message)
        elif self._on_notification is not None:
            self._on_notification(message)

    def _sink_for(self, message: dict[str, Any]) -> EventSink | None:
        """The call a notification belongs to: by progress token, or the only call in flight for a log line."""
        params = message.get("params")
        method = message.get("method")
        if method == "notifications/progress" and isinstance(params, dict):
            pending = self._pending.get(params.get("progressToken"))  # type: ignore[arg-type]
            return pending.on_event if pending else None
        if method == "notifications/message" and len(self._pending) == 1:
            # With several calls in flight a log line cannot be attributed; it goes to the daemon's log.
            return next(iter(self._pending.values())).on_event
        return None

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None and self._stderr is not None
        stream = self._proc.stderr
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                continue
            if not line:
                return
            self._activity()
            self._stderr.line(line.decode("utf-8", "replace").rstrip("\r\n"))

    async def _wait_exit(self) -> None:
        assert self._proc is not None and self._stderr is not None and self._stdout is not None
        returncode = await self._proc.wait()
        # Let the readers take what the child wrote before exiting, so its last words reach the log.
        await asyncio.wait([self._stdout.closed, self._tasks[0]], timeout=SIGKILL_GRACE)
        self.exit_info = ExitInfo(returncode, list(self._stderr.tail))
        level = logging.INFO if self._closing else logging.WARNING
        logger.log(level, "server=%s pid=%d exited: %s", self.tag, self._proc.pid, self.exit_info.describe())
        # The owner learns of the exit before any caller does, so its state is right when they see the error.
        if self._on_exit is not None:
            self._on_exit(self)
        self._fail_pending(self.exit_info)
        await self._reap_group()
        self._exited.set()

    def fail_calls(self, error: GatewayError) -> None:
        """Fail every call waiting on this child with `error` (the child keeps running until closed)."""
        for call_id, pending in list(self._pending.items()):
            if not pending.future.done():
                pending.future.set_exception(error)
            self._pending.pop(call_id, None)

    def _fail_pending(self, info: ExitInfo) -> None:
        for call_id, pending in list(self._pending.items()):
            if not pending.future.done():
                pending.future.set_exception(
                    ToolServerUnavailable(
                        f"tool server {self.name!r} exited during {pending.method} ({info.describe()})",
                        {"server": self.name, "exit_status": info.returncode, "stderr_tail": info.stderr_tail},
                    )
                )
            self._pending.pop(call_id, None)

    def _unavailable(self, what: str, *, retryable: bool = True) -> ToolServerUnavailable:
        error = ToolServerUnavailable(f"tool server {self.name!r} {what}", {"server": self.name})
        if not retryable:
            error.data["retryable"] = False
        return error

    # -- stopping --------------------------------------------------------------------------

    async def _reap_group(self) -> None:
        """Kill what is left of the child's process group (grandchildren), bounded."""
        assert self._proc is not None
        if not _group_alive(self._proc.pid):
            return
        _signal_group(self._proc.pid, signal.SIGTERM)
        if not await _group_gone(self._proc.pid, SIGTERM_GRACE):
            _signal_group(self._proc.pid, signal.SIGKILL)
            await _group_gone(self._proc.pid, SIGKILL_GRACE)

    async def close(self) -> ExitInfo:
        """Stop the child: close stdin, wait, SIGTERM the group, wait, SIGKILL. Every wait is bounded."""
        self._closing = True
        proc = self._proc
        if proc is None:
            return ExitInfo(None, [])
        if not self._exited.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                self._flush()
                if proc.stdin is not None:
                    proc.stdin.close()
            if not await _wait_event(self._exited, STDIN_CLOSE_GRACE):
                _signal_group(proc.pid, signal.SIGTERM)
                if not await _wait_event(self._exited, SIGTERM_GRACE):
                    _signal_group(proc.pid, signal.SIGKILL)
                    await _wait_event(self._exited, SIGKILL_GRACE + SIGTERM_GRACE)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.exit_info is None:
            self.exit_info = ExitInfo(proc.returncode, list(self._stderr.tail) if self._stderr else [])
            self._fail_pending(self.exit_info)
        return self.exit_info


class Lines:
    """The child's stdout cut into lines as it arrives, for `on_lines`: no reader task and no stream buffer sit
    between a child's answer and the call waiting for it (in profiles of the loaded daemon they were a few percent
    of a call). A line longer than MAX_LINE_BYTES is dropped up to its newline, and `on_overlong` told, where a
    StreamReader let the rest of it through as garbage lines; memory stays bounded by that limit. A last line
    without a newline still counts at EOF."""

    def __init__(self, on_lines: Callable[[list[bytes]], None], on_overlong: Callable[[], None]) -> None:
        self._on_lines = on_lines
        self._on_overlong = on_overlong
        self._partial: list[bytes] = []  # the start of a line still waiting for its newline
        self._partial_size = 0
        self._skipping = False  # inside an overlong line: drop until its newline
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes) -> None:
        start = 0
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return
            self._skipping = False
            start = end + 1
        lines: list[bytes] = []
        while (end := data.find(b"\n", start)) >= 0:
            if self._partial:
                self._keep(data[start:end])
                if not self._skipping:
                    lines.append(b"".join(self._partial))
                self._partial, self._partial_size, self._skipping = [], 0, False
            else:
                self._keep_whole(lines, data[start:end])
            start = end + 1
        if start < len(data):
            self._keep(data[start:] if start else data)
        if lines:
            self._on_lines(lines)

    def eof(self) -> None:
        if self._partial and not self._skipping:
            self._on_lines([b"".join(self._partial)])
        self._partial = []
        if not self.closed.done():
            self.closed.set_result(None)

    def _keep_whole(self, lines: list[bytes], line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            self._on_overlong()
        else:
            lines.append(line)

    def _keep(self, chunk: bytes) -> None:
        if self._skipping:
            return
        self._partial_size += len(chunk)
        if self._partial_size > MAX_LINE_BYTES:
            self._partial, self._partial_size, self._skipping = [], 0, True
            self._on_overlong()
        else:
            self._partial.append(chunk)


class _ChildProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's subprocess protocol (stdin writer, stderr reader, exit), with stdout going to `Lines`."""

    def __init__(self, stdout: Lines, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=MAX_LINE_BYTES, loop=loop)
        self._lines = stdout

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd == 1:
            assert isinstance(data, bytes)
            self._lines.feed(data)
        else:
            super().pipe_data_received(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        super().pipe_connection_lost(fd, exc)
        if fd == 1:
            self._lines.eof()


async def _wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class _Expired(Exception):
    """A call's deadline passed: set on its future by its timer."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Expired())


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in the group.

    Zombies count as gone: orphans are reaped by init, which in a container may never happen.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(state != "Z" for state in _group_states(pgid))


def _group_states(pgid: int) -> list[str]:
    states = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            states.append(fields[0])
    return states


async def _group_gone(pgid: int, timeout: float) -> bool:
    """Poll until no process of the group is left; the members are not our children, so polling is all there is."""
    deadline = time.monotonic() + timeout
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(GROUP_POLL_INTERVAL)
    return True
