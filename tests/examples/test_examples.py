"""End-to-end tests of the example servers (calc, shell, clock) and the faultsrv fixture.

Each test drives a real child process over its stdio; every wait is bounded by a deadline on select or
communicate rather than by sleeping.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final

import pytest

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
FAULTSRV: Final = REPO_ROOT / "tests" / "fixtures" / "faultsrv.py"
READ_TIMEOUT_SECONDS: Final = 10.0
EXIT_TIMEOUT_SECONDS: Final = 10.0
READ_CHUNK_BYTES: Final = 1 << 20
HUGE_SIZE: Final = 10 * 1024 * 1024

Message = dict[str, Any]


class LineProcess:
    """A child speaking newline-delimited JSON, with deadline-bounded line reads."""

    def __init__(self, argv: list[str]) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # a file, so a chatty child never blocks on it
        self.proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._buffer = bytearray()
        self._scanned = 0  # bytes of _buffer already known to hold no newline

    def send(self, message: Message | list[Message] | bytes) -> None:
        assert self.proc.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, request_id: int | str, method: str, params: Any = None) -> None:
        message: Message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def read_line(self, timeout: float = READ_TIMEOUT_SECONDS) -> bytes | None:
        """The next stdout line without its newline, or None at EOF; fails the test on timeout."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (newline := self._buffer.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buffer)
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, remaining))
            if not ready:
                pytest.fail(f"no stdout line within {timeout} s; have {bytes(self._buffer[:200])!r}")
            chunk = os.read(self.proc.stdout.fileno(), READ_CHUNK_BYTES)
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        self._scanned = 0
        return line

    def read_message(self) -> Any:
        line = self.read_line()
        assert line is not None, "unexpected EOF on stdout"
        return json.loads(line)

    def read_until_response(self, request_id: int | str) -> tuple[list[Message], Message]:
        """Messages seen before the response to ``request_id``, and that response."""
        before: list[Message] = []
        while True:
            message = self.read_message()
            if message.get("id") == request_id and "method" not in message:
                return before, message
            before.append(message)

    def finish(self) -> tuple[list[bytes], int]:
        """Close stdin, then return the remaining stdout lines and the exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rest: list[bytes] = []
        while (line := self.read_line()) is not None:
            rest.append(line)
        return rest, self.proc.wait(timeout=EXIT_TIMEOUT_SECONDS)

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=EXIT_TIMEOUT_SECONDS)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()


Spawn = Callable[..., LineProcess]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[LineProcess] = []

    def start(*argv: str) -> LineProcess:
        process = LineProcess([sys.executable, *argv])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def run_lines(argv: list[str], lines: list[Any]) -> tuple[list[Any], str, int]:
    """Feed all lines at once, close stdin, and return (decoded stdout lines, stderr, exit status)."""
    payload = b"".join(
        line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n" for line in lines
    )
    completed = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO_ROOT,
        input=payload,
        capture_output=True,
        timeout=EXIT_TIMEOUT_SECONDS,
    )
    replies = [json.loads(line) for line in completed.stdout.splitlines()]
    return replies, completed.stderr.decode(), completed.returncode


def rpc(request_id: int | str | None, method: str, params: Any = None) -> Message:
    message: Message = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return message


def initialize(process: LineProcess) -> Message:
    process.request(
        0,
        "initialize",
        {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
    )
    _, reply = process.read_until_response(0)
    process.send(rpc(None, "notifications/initialized"))
    return reply


def call_tool(
    process: LineProcess, request_id: int | str, name: str, arguments: Message, token: Any = None
) -> None:
    params: Message = {"name": name, "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    process.request(request_id, "tools/call", params)


# --- calc ----------------------------------------------------------------------------------------------

CALC: Final = ["-m", "gatewayd.examples.calc"]


def test_calc_methods_and_errors() -> None:
    replies, _, status = run_lines(
        CALC,
        [
            rpc(1, "add", {"a": 1, "b": 2}),
            rpc(2, "subtract", [5, 3]),
            rpc(3, "divide", {"a": 1, "b": 0}),
            rpc(4, "nope"),
            b"{not json\n",
            rpc(5, "multiply", {"a": True, "b": 2}),
            rpc(6, "echo", {"any": ["thing", 1]}),
            {"jsonrpc": "2.0", "id": 7},
        ],
    )
    assert status == 0
    assert replies[0] == {"jsonrpc": "2.0", "id": 1, "result": 3}
    assert replies[1]["result"] == 2
    assert replies[2]["error"] == {"code": -32000, "message": "division by zero"}
    assert replies[3]["id"] == 4 and replies[3]["error"]["code"] == -32601
    assert replies[4]["id"] is None and replies[4]["error"]["code"] == -32700
    assert replies[5]["error"]["code"] == -32602
    assert replies[6]["result"] == {"any": ["thing", 1]}
    assert replies[7]["id"] == 7 and replies[7]["error"]["code"] == -32600
    assert len(replies) == 8


def test_calc_notifications_and_batches() -> None:
    replies, stderr, status = run_lines(
        CALC,
        [
            rpc(None, "log", {"message": "hello from a notification"}),
            [rpc(1, "add", [1, 1]), rpc(None, "log", {"message": "in batch"}), 5, rpc(2, "nope")],
            b"[]\n",
            [rpc(None, "log", {"message": "only notifications"}), rpc(None, "add", [1, 2])],
            rpc(3, "log", {"message": "with id"}),
        ],
    )
    assert status == 0
    batch, empty, logged = replies
    assert [entry.get("id") for entry in batch] == [1, None, 2]
    assert batch[0]["result"] == 2
    assert batch[1]["error"]["code"] == -32600
    assert batch[2]["error"]["code"] == -32601
    assert empty["id"] is None and empty["error"]["code"] == -32600
    assert logged == {"jsonrpc": "2.0", "id": 3, "result": None}
    for text in ("hello from a notification", "in batch", "only notifications", "with id"):
        assert text in stderr


# --- shell ---------------------------------------------------------------------------------------------

SHELL: Final = ["-m", "gatewayd.examples.shell"]


def test_shell_handshake_and_streamed_run(spawn: Spawn) -> None:
    shell = spawn(*SHELL)
    init = initialize(shell)["result"]
    assert init["protocolVersion"] == "2025-06-18"
    assert init["capabilities"] == {"tools": {}, "logging": {}}
    assert init["serverInfo"] == {"name": "gatewayd-shell", "version": "0.1.0"}

    shell.request(1, "tools/list")
    _, listed = shell.read_until_response(1)
    (tool,) = listed["result"]["tools"]
    assert tool["name"] == "run" and tool["inputSchema"]["required"] == ["command"]
    assert tool["annotations"] == {"destructiveHint": True}

    call_tool(shell, 2, "run", {"command": "printf 'a\\nb\\n'"}, token="tok")
    before, reply = shell.read_until_response(2)
    progress = [m["params"] for m in before if m["method"] == "notifications/progress"]
    logs = [m["params"] for m in before if m["method"] == "notifications/message"]
    assert progress == [
        {"progressToken": "tok", "progress": 1, "message": "a"},
        {"progressToken": "tok", "progress": 2, "message": "b"},
    ]
    assert logs == [
        {"level": "info", "logger": "shell.run", "data": "a"},
        {"level": "info", "logger": "shell.run", "data": "b"},
    ]
    result = reply["result"]
    assert result["isError"] is False
    assert result["structuredContent"] == {"exit_code": 0, "output": "a\nb\n"}
    assert result["content"] == [{"type": "text", "text": "a\nb\n\n[exit status 0]"}]
    assert shell.finish()[1] == 0


def test_shell_failures(spawn: Spawn) -> None:
    shell = spawn(*SHELL)
    initialize(shell)
    call_tool(shell, 1, "run", {"command": "echo oops >&2; exit 3"})
    result = shell.read_until_response(1)[1]["result"]
    assert result["isError"] is True
    assert result["structuredContent"] == {"exit_code": 3, "output": "oops\n"}

    call_tool(shell, 2, "run", {"command": "sleep 5", "timeout": 0.2})
    result = shell.read_until_response(2)[1]["result"]
    assert result["isError"] is True and "timed out" in result["content"][0]["text"]

    call_tool(shell, 3, "run", {})
    result = shell.read_until_response(3)[1]["result"]
    assert result["isError"] is True and "'command'" in result["content"][0]["text"]

    call_tool(shell, 4, "nope", {})
    result = shell.read_until_response(4)[1]["result"]
    assert result == {"content": [{"type": "text", "text": "Unknown tool: nope"}], "isError": True}

    shell.request(5, "no/such/method")
    assert shell.read_until_response(5)[1]["error"]["code"] == -32601


def test_shell_cancellation_kills_command(spawn: Spawn) -> None:
    shell = spawn(*SHELL)
    initialize(shell)
    # exec keeps the shell's pid, so the first output line names the process that must die.
    call_tool(shell, 7, "run", {"command": "echo $$; exec sleep 30"}, token="t")
    first = shell.read_message()
    assert first["method"] == "notifications/progress"
    pid = int(first["params"]["message"])
    exit_watch = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None

    shell.send(rpc(None, "notifications/cancelled", {"requestId": 7, "reason": "test"}))
    if exit_watch is not None:
        ready, _, _ = select.select([exit_watch], [], [], READ_TIMEOUT_SECONDS)
        os.close(exit_watch)
        assert ready, "cancelled command is still running"
    shell.request(8, "ping")
    before, pong = shell.read_until_response(8)
    assert pong["result"] == {}
    rest, status = shell.finish()
    seen = before + [json.loads(line) for line in rest]
    assert not [m for m in seen if m.get("id") == 7], "a cancelled request must get no response"
    assert status == 0


# --- clock ---------------------------------------------------------------------------------------------

CLOCK: Final = ["-m", "gatewayd.examples.clock"]


def test_clock_now_and_countdown(spawn: Spawn) -> None:
    clock = spawn(*CLOCK)
    initialize(clock)
    call_tool(clock, 1, "now", {})
    result = clock.read_until_response(1)[1]["result"]
    assert result["structuredContent"]["timezone"] == "UTC"
    assert datetime.fromisoformat(result["content"][0]["text"]).utcoffset() is not None

    call_tool(clock, 2, "now", {"timezone": "No/Such_Zone"})
    assert clock.read_until_response(2)[1]["result"]["isError"] is True

    call_tool(clock, 3, "countdown", {"seconds": 2}, token=99)
    before, reply = clock.read_until_response(3)
    assert [m["params"] for m in before] == [
        {"progressToken": 99, "progress": 1, "total": 2, "message": "1/2"},
        {"progressToken": 99, "progress": 2, "total": 2, "message": "2/2"},
    ]
    assert reply["result"]["content"] == [{"type": "text", "text": "done"}]
    assert clock.finish()[1] == 0


# --- faultsrv ------------------------------------------------------------------------------------------


def test_faultsrv_echo_banner_and_garbage(spawn: Spawn) -> None:
    server = spawn(str(FAULTSRV), "--banner", "not json at all")
    assert server.read_line() == b"not json at all"
    server.request(1, "echo", {"x": [1, 2]})
    assert server.read_message() == {"jsonrpc": "2.0", "id": 1, "result": {"x": [1, 2]}}
    server.request(2, "garbage")
    assert server.read_line() == b"this is not json"
    assert server.read_message()["result"] == "ok"
    # A slow call must not hold up a fast one.
    server.request(3, "sleep", {"seconds": 0.3})
    server.request(4, "pid")
    assert server.read_message() == {"jsonrpc": "2.0", "id": 4, "result": server.proc.pid}
    assert server.read_message() == {"jsonrpc": "2.0", "id": 3, "result": {"slept": 0.3}}
    assert server.finish() == ([], 0)


def test_faultsrv_huge_line(spawn: Spawn) -> None:
    server = spawn(str(FAULTSRV))
    server.request(1, "huge", {"size": HUGE_SIZE})
    reply = server.read_message()
    assert reply["id"] == 1 and reply["result"] == "x" * HUGE_SIZE


def test_faultsrv_crash_exit_code(spawn: Spawn) -> None:
    server = spawn(str(FAULTSRV))
    server.request(1, "crash", {"code": 7})
    assert server.read_line() is None  # exits without answering
    assert server.proc.wait(timeout=EXIT_TIMEOUT_SECONDS) == 7
    assert "crashing" in server.stderr_text()

    early = subprocess.run(
        [sys.executable, str(FAULTSRV), "--crash-on-start"], capture_output=True, timeout=EXIT_TIMEOUT_SECONDS
    )
    assert early.returncode == 3 and early.stdout == b""


def test_faultsrv_record_file(tmp_path: Path) -> None:
    record = tmp_path / "received.jsonl"
    lines = [rpc(1, "echo", {"n": 1}), rpc(None, "notifications/cancelled", {"requestId": 1}), rpc(2, "cwd")]
    sent = [json.dumps(line).encode() for line in lines]
    replies, _, status = run_lines([str(FAULTSRV), "--record", str(record)], lines)
    assert status == 0
    assert [reply["id"] for reply in replies] == [1, 2]
    assert record.read_bytes().splitlines() == sent


def test_faultsrv_mcp_tools(spawn: Spawn) -> None:
    server = spawn(str(FAULTSRV), "--mcp")
    assert initialize(server)["result"]["serverInfo"]["name"] == "faultsrv"
    call_tool(server, 1, "echo", {"k": "v"})
    assert server.read_until_response(1)[1]["result"] == {
        "content": [{"type": "text", "text": '{"k": "v"}'}],
        "structuredContent": {"value": {"k": "v"}},
    }
    call_tool(server, 2, "change_tools", {})
    before, _ = server.read_until_response(2)
    assert [m["method"] for m in before] == ["notifications/tools/list_changed"]
    server.request(3, "tools/list")
    names = [tool["name"] for tool in server.read_until_response(3)[1]["result"]["tools"]]
    assert "extra" in names and "sleep" in names
