"""One stdio child process: spawn, stdout line framing, stderr logging, exit detection, shutdown escalation.

Owns: the process (in its own process group) and its minimal environment, its stdin/stdout/stderr
pipes and how many bytes wait in front of its stdin, the rate-limited log of its stderr (which goes
to the daemon's log only: it is every client's child, so no caller is shown it), how it ended
(`ExitInfo`), and the ordered stop: close stdin, wait, SIGTERM the group, wait, SIGKILL, then reap
what is left of the group.
Does not own: what the bytes mean (peer.py: JSON-RPC ids, pending calls), or restarts and idle
timers (server.py). It writes the bytes it is given, hands each whole stdout line to its owner
in the pipe's own callback, and tells its owner once when the child has exited.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gatewayd.deadlines import set_within
from gatewayd.errors import ToolServerUnavailable

logger = logging.getLogger(__name__)

# A child's message may be this large; asyncio's 64 KiB default breaks real tool servers.
MAX_LINE_BYTES = 16 * 1024 * 1024
# A line of a child's stdout still incomplete after this many bytes is a large answer coming in, written in bursts
# larger than the pipe's default buffer (Linux: 64 KiB): the child blocks on the full pipe and the loop wakes for
# each 64 KiB. Such a child's pipe is widened, once, to CHILD_STDOUT_PIPE_BYTES (bench.scale's payload: a 10 MiB
# answer in ×0.83 the time; 256 KiB gave ×0.92). Only such children's: every widened pipe counts against the user's
# pipe-user-pages-soft (64 MiB by default for a user without CAP_SYS_RESOURCE), past which the kernel gives new pipes
# a single page, and a child that floods small messages is read no faster for it. A widening the kernel refuses
# leaves the pipe as it was.
LONG_LINE_BYTES = 64 * 1024
CHILD_STDOUT_PIPE_BYTES = 1024 * 1024
# How much of an overlong line's start and end is kept, to learn which call it answered (`Lines`): the `"jsonrpc"`
# and `"id"` members come first in what JSON-RPC libraries write; some write the `"id"` last.
OVERLONG_HEAD_BYTES = 256
OVERLONG_TAIL_BYTES = 256
# Grace period for the child to exit on its own after its stdin closes.
STDIN_CLOSE_GRACE = 2.0
# Grace period after SIGTERM before the whole process group is killed.
SIGTERM_GRACE = 3.0
# Bound on waiting for the kernel to reap a SIGKILLed group.
SIGKILL_GRACE = 2.0
# How often to check whether leftover group members (grandchildren) are gone.
GROUP_POLL_INTERVAL = 0.02
# Stderr lines logged per window before the rest are counted, not logged.
STDERR_LOG_BURST = 50
STDERR_LOG_WINDOW = 1.0
# A child's last stderr lines kept, for the caller of a child that is its own alone (a per-client or per-session
# child, fleet.py) when it dies during a call: this many, each cut to this many characters, error lines first.
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 300
# What marks a stderr line as an error (or a traceback's) rather than a child's chatter.
ERROR_LINE = re.compile(r"error|exception|traceback|fatal|panic|critical|^\s+File \"", re.IGNORECASE)
# What spawning answers for a program that is not there or may not be run (errno).
CANNOT_RUN = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
# A whole line of a child's stdout: the bytes of one read, or the bytearray a line that came in several reads was
# gathered in (handed on as it is: joining its pieces copied a large answer once more, ~5 ms for 10 MiB).
Line = bytes | bytearray
# A few child variables a tool server usually needs; everything else must be set in its config.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR", "VIRTUAL_ENV")


def watch_exits_by_pidfd(loop: asyncio.AbstractEventLoop) -> bool:
    """On Python 3.11, have `loop` learn of its children's exits from pidfds, as 3.12 does itself: 3.11's default
    waits for each child in a thread of its own (bench.scale children: 105 threads and 42 KB of daemon RSS a child for
    100 per-session children; 4 threads and 26 KB with pidfds). Only for the daemon's own loop (cli.py), which is the
    only one its process runs. Whether it was done: not on 3.12 and later, nor where the kernel has no pidfd_open
    (Linux before 5.3, or a seccomp filter refusing it)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(loop)
    asyncio.set_child_watcher(watcher)
    return True


@dataclass
class ExitInfo:
    """How a child ended, for errors and logs; its stderr went to the daemon's log, line by line, and its last
    lines are kept in `tail` (error lines and tracebacks first) for a caller that may see them."""

    returncode: int | None
    tail: tuple[str, ...] = ()

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
        self._window_start = 0.0
        self._in_window = 0
        self._suppressed = 0
        self._recent: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES * 4)

    def tail(self) -> tuple[str, ...]:
        """The last lines, error lines and tracebacks first, at most STDERR_TAIL_LINES."""
        errors = [line for line in self._recent if ERROR_LINE.search(line)][-STDERR_TAIL_LINES:]
        rest = [line for line in self._recent if not ERROR_LINE.search(line)]
        return tuple(errors + rest[len(rest) - max(0, STDERR_TAIL_LINES - len(errors)):])

    def line(self, text: str) -> None:
        self._recent.append(text[:STDERR_TAIL_CHARS])
        now = time.monotonic()
        if now - self._window_start >= STDERR_LOG_WINDOW:
            self.flush()
            self._window_start, self._in_window = now, 0
        self._in_window += 1
        if self._in_window <= STDERR_LOG_BURST:
            logger.info("server=%s pid=%d stderr: %s", self.tag, self.pid, text)
        else:
            self._suppressed += 1

    def flush(self) -> None:
        """Log how many lines the rate limit held back; also at exit, so the count of a last burst is not lost."""
        if self._suppressed:
            logger.warning("server=%s pid=%d stderr: %d lines not logged (rate limit)", self.tag, self.pid,
                           self._suppressed)
            self._suppressed = 0


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: a few inherited variables plus the server's own `env`."""
    env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
    env.update(extra)
    return env


def unavailable(name: str, what: str, *, retryable: bool = True) -> ToolServerUnavailable:
    """The error for a child that cannot take or answer a message: "tool server 'name' <what>"."""
    error = ToolServerUnavailable(f"tool server {name!r} {what}", {"server": name})
    if not retryable:
        error.data["retryable"] = False
    return error


class ChildProcess:
    """A stdio child in its own process group. Use `open(on_lines)`, then `write`, then `close()`.

    `on_activity` is called on stderr output and on overlong stdout lines (the owner of the stdout
    lines tells it of those itself, so the pipe callback makes no extra call); `on_exit` is called once,
    with the `ExitInfo`, when the child has exited on its own or been stopped, before the rest of its
    process group is reaped.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        tag: str | None = None,
        on_activity: Callable[[], None] | None = None,
        on_exit: Callable[[ExitInfo], None] | None = None,
    ) -> None:
        self.name = name
        # How log lines name this child: the server and the config generation it was started for.
        self.tag = tag or name
        self.argv = argv
        self.env = child_env(env or {})
        self.cwd = cwd
        self._on_activity = on_activity
        self._on_exit = on_exit
        self._on_overlong: Callable[[bytes, bytes | None], None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stdin: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stderr: _StderrLog | None = None
        self._stdout: Lines | None = None
        self._stdout_pipe: asyncio.ReadTransport | None = None
        self._exited = asyncio.Event()
        self.exit_info: ExitInfo | None = None
        self._closing = False

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        assert self._proc is not None, "open() first"
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the child is running and not being stopped."""
        return self._proc is not None and not self._exited.is_set() and not self._closing

    async def open(self, on_lines: Callable[[list[Line]], None],
                   on_overlong: Callable[[bytes, bytes | None], None] | None = None) -> None:
        """Spawn the child in its own process group; its stdout goes to `on_lines`, whole lines as they arrive, and
        the head and tail of a line over MAX_LINE_BYTES to `on_overlong` (`Lines`). Raises ToolServerUnavailable if
        it cannot start."""
        assert self._proc is None, "a child is opened once"
        loop = asyncio.get_running_loop()
        self._on_overlong = on_overlong
        self._stdout = Lines(on_lines, self._overlong_line)
        # The child's stdout is a pipe of the daemon's own, read in the loop's own read callback: through asyncio's
        # subprocess transport each chunk waited one more loop turn (a call_soon) before it was seen.
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            transport, protocol = await self._spawn(loop, write_end)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        try:
            self._stdout_pipe, _ = await loop.connect_read_pipe(functools.partial(_Stdout, self._stdout),
                                                                os.fdopen(read_end, "rb", buffering=0))
        except BaseException:
            transport.close()  # kills the child: it would run with nobody reading it
            raise
        self._proc = asyncio.subprocess.Process(transport, protocol, loop)
        self._stdin = self._proc.stdin
        self._stderr = _StderrLog(self.tag, self._proc.pid)
        logger.info("server=%s pid=%d started: %s", self.tag, self._proc.pid, " ".join(self.argv))
        self._tasks = [
            asyncio.create_task(self._read_stderr(), name=f"{self.name}-stderr"),
            asyncio.create_task(self._wait_exit(), name=f"{self.name}-wait"),
        ]

    async def _spawn(self, loop: asyncio.AbstractEventLoop, stdout: int) -> tuple[
            asyncio.SubprocessTransport, asyncio.subprocess.SubprocessStreamProtocol]:
        """The child, in its own process group, writing to `stdout`. Raises ToolServerUnavailable if it cannot
        start."""
        try:
            return await loop.subprocess_exec(
                functools.partial(asyncio.subprocess.SubprocessStreamProtocol, MAX_LINE_BYTES, loop),
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=stdout,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            # A program that is missing or may not be run stays so: retrying the call cannot help.
            raise ToolServerUnavailable(
                f"tool server {self.name!r} could not start: {exc.strerror or exc}",
                {"server": self.name, "command": self.argv,
                 **({"retryable": False} if exc.errno in CANNOT_RUN else {})},
            ) from exc

    async def wait_exited(self, timeout: float | None) -> bool:
        """Whether the child exits (and its owner has been told) within `timeout` seconds (None: ever)."""
        return await set_within(self._exited, timeout)

    # -- stdin -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Write bytes to the child's stdin; dropped once stdin is closed (the exit will be reported)."""
        stdin = self._stdin
        if stdin is None or stdin.is_closing():
            return
        stdin.write(data)

    def backlog(self) -> int:
        """Bytes written that the child's stdin has not taken yet: only when some wait can a drain wait for
        anything, and a child that does not read lets them grow."""
        stdin = self._stdin
        return stdin.transport.get_write_buffer_size() if stdin is not None else 0

    async def drain(self) -> None:
        """Wait until the child's stdin takes what was written. Raises ToolServerUnavailable once it is closed."""
        assert self._stdin is not None, "open() first"
        try:
            await self._stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise unavailable(self.name, "closed its stdin") from exc

    # -- output and exit -------------------------------------------------------------------

    def _overlong_line(self, head: bytes, tail: bytes | None) -> None:
        if tail is None:  # said once a line, as it crosses the limit
            self._activity()
            logger.warning("server=%s pid=%d stdout line over %d bytes dropped: %.100r", self.tag, self.pid,
                           MAX_LINE_BYTES, head)
        if self._on_overlong is not None:
            self._on_overlong(head, tail)

    def _activity(self) -> None:
        if self._on_activity is not None:
            self._on_activity()

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
        self._stderr.flush()
        self.exit_info = ExitInfo(returncode, self._stderr.tail())
        level = logging.INFO if self._closing else logging.WARNING
        logger.log(level, "server=%s pid=%d exited: %s", self.tag, self._proc.pid, self.exit_info.describe())
        if self._on_exit is not None:
            self._on_exit(self.exit_info)
        await self._reap_group()
        self._close_stdout()
        self._exited.set()
        self._let_go()

    def _let_go(self) -> None:
        """Once the child is gone, drop its owners' callbacks and its stdout framer: bound methods of whoever holds
        this child, each a reference cycle through it, which left a stopped child's whole graph (its connection,
        peer, server, pipes: ~100 objects) to the cyclic collector instead of its reference counts (bench/soak.py)."""
        self._on_exit = self._on_activity = self._on_overlong = None
        self._stdout = None

    def _close_stdout(self) -> None:
        """Close the stdout pipe: at EOF already once the child's group is gone, unless its wait was cut off."""
        if self._stdout_pipe is not None:
            self._stdout_pipe.close()

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

    async def close(self, flush: Callable[[], None] | None = None) -> ExitInfo:
        """Stop the child: close stdin, wait, SIGTERM the group, wait, SIGKILL. Every wait is bounded.

        `flush` writes what the owner still holds for stdin, just before stdin closes. If the child's
        exit was never seen (its wait was cut off), `exit_info` is made here and `on_exit` is not called.
        """
        self._closing = True
        proc = self._proc
        if proc is None:
            return ExitInfo(None)
        if not self._exited.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                if flush is not None:
                    flush()
                if proc.stdin is not None:
                    proc.stdin.close()
            if not await set_within(self._exited, STDIN_CLOSE_GRACE):
                _signal_group(proc.pid, signal.SIGTERM)
                if not await set_within(self._exited, SIGTERM_GRACE):
                    _signal_group(proc.pid, signal.SIGKILL)
                    await set_within(self._exited, SIGKILL_GRACE + SIGTERM_GRACE)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._close_stdout()
        if self.exit_info is None:
            self.exit_info = ExitInfo(proc.returncode)
        return self.exit_info


class Lines:
    """The child's stdout cut into lines as it arrives, for `on_lines`: no reader task and no stream buffer sit
    between a child's answer and the call waiting for it (in profiles of the loaded daemon they were a few percent
    of a call). A line longer than MAX_LINE_BYTES is dropped up to its newline, where a StreamReader let the rest of
    it through as garbage lines; memory stays bounded by that limit. `on_overlong` is told of such a line twice:
    with its first OVERLONG_HEAD_BYTES and None as it crosses the limit (its end may be far off, or never come), then
    with the same head and its last OVERLONG_TAIL_BYTES once its newline comes. A last line without a newline still
    counts at EOF (an overlong one cut off by EOF is not told of again: the child is gone)."""

    def __init__(self, on_lines: Callable[[list[Line]], None],
                 on_overlong: Callable[[bytes, bytes | None], None]) -> None:
        self._on_lines = on_lines
        self._on_overlong = on_overlong
        self._partial = bytearray()  # the start of a line still waiting for its newline
        self._skipping = False  # inside an overlong line: drop until its newline
        self._head = b""  # of the overlong line being dropped
        self._tail = b""  # its last bytes so far
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes) -> None:
        start = 0
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                self._tail = (self._tail + data[-OVERLONG_TAIL_BYTES:])[-OVERLONG_TAIL_BYTES:]
                return
            self._skipped(data[:end])
            start = end + 1
        lines: list[Line] = []
        while (end := data.find(b"\n", start)) >= 0:
            if self._partial:
                self._keep(data[start:end])
                if self._skipping:
                    self._skipped(b"")
                else:
                    lines.append(self._partial)
                self._partial = bytearray()
            else:
                self._keep_whole(lines, data[start:end])
            start = end + 1
        if start < len(data):
            self._keep(data[start:] if start else data)
        if lines:
            self._on_lines(lines)

    @property
    def pending(self) -> int:
        """Bytes of a line still waiting for its newline."""
        return len(self._partial)

    def eof(self) -> None:
        if self._partial and not self._skipping:
            self._on_lines([self._partial])
        self._partial = bytearray()
        if not self.closed.done():
            self.closed.set_result(None)

    def _keep_whole(self, lines: list[Line], line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            head = line[:OVERLONG_HEAD_BYTES]
            self._on_overlong(head, None)
            self._on_overlong(head, line[-OVERLONG_TAIL_BYTES:])
        else:
            lines.append(line)

    def _keep(self, chunk: bytes) -> None:
        if self._skipping:
            self._tail = (self._tail + chunk[-OVERLONG_TAIL_BYTES:])[-OVERLONG_TAIL_BYTES:]
            return
        if len(self._partial) + len(chunk) > MAX_LINE_BYTES:
            # The line's first and last bytes, whichever reads they came in: they say which call it answers.
            kept = bytes(self._partial[:OVERLONG_HEAD_BYTES])
            self._head = kept + chunk[:OVERLONG_HEAD_BYTES - len(kept)]
            self._tail = (bytes(self._partial[-OVERLONG_TAIL_BYTES:]) + chunk[-OVERLONG_TAIL_BYTES:])[
                -OVERLONG_TAIL_BYTES:]
            self._partial, self._skipping = bytearray(), True
            self._on_overlong(self._head, None)
        else:
            self._partial += chunk

    def _skipped(self, last: bytes) -> None:
        """The overlong line being dropped ends with `last`."""
        tail = (self._tail + last[-OVERLONG_TAIL_BYTES:])[-OVERLONG_TAIL_BYTES:]
        head, self._head, self._tail, self._skipping = self._head, b"", b"", False
        self._on_overlong(head, tail)


class _Stdout(asyncio.Protocol):
    """The child's stdout pipe: chunks to `Lines` as the loop reads them."""

    def __init__(self, lines: Lines) -> None:
        self._lines = lines
        self._pipe: asyncio.BaseTransport | None = None  # until it is widened

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._pipe = transport

    def data_received(self, data: bytes) -> None:
        self._lines.feed(data)
        if self._lines.pending >= LONG_LINE_BYTES and self._pipe is not None:
            _widen(self._pipe)
            self._pipe = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lines.eof()


def _widen(pipe: asyncio.BaseTransport) -> None:
    """Give the child's stdout pipe CHILD_STDOUT_PIPE_BYTES of buffer, if the kernel lets us."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    end = pipe.get_extra_info("pipe")
    if setpipe is None or end is None:
        return
    try:
        fcntl.fcntl(end.fileno(), setpipe, CHILD_STDOUT_PIPE_BYTES)
    except OSError as exc:  # over the user's pipe quota, or past pipe-max-size
        logger.debug("stdout pipe not widened: %s", exc)


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
