"""Supervising real stdio children: lazy start, crashes, hangs, garbage, huge lines, limits, stop."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
import time
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest

from gatewayd.config.models import ServerConfig
from gatewayd.errors import CallTimedOut, Overloaded, ToolServerFailed, ToolServerUnavailable
from gatewayd.upstream.api import Delivery
from gatewayd.upstream.process import CHILD_STDOUT_PIPE_BYTES, MAX_LINE_BYTES
from gatewayd.upstream.server import State, ToolServer
from tests.daemon import FAULTSRV
from tests.waiting import eventually, process_gone

FAULT_METHODS: dict[str, dict[str, Any]] = {name: {} for name in (
    "echo", "sleep", "crash", "garbage", "huge", "grandchild", "wrong_id", "stderr_flood", "progress", "pid", "env",
    "pipe_size",
)}


def fault_server(tmp_path: Path, *flags: str, **config: Any) -> ToolServer:
    """A ToolServer running the fault fixture; plain JSON-RPC unless `--mcp` is among the flags."""
    mcp = "--mcp" in flags
    fields: dict[str, Any] = {
        "command": [sys.executable, str(FAULTSRV), *flags],
        "protocol": "mcp" if mcp else "jsonrpc",
        "idle_timeout": 0,
        "methods": {} if mcp else FAULT_METHODS,
    }
    fields.update(config)
    return ToolServer("fault", ServerConfig.model_validate(fields), tmp_path)


@pytest.fixture
async def servers() -> Any:
    started: list[ToolServer] = []
    yield started
    await asyncio.gather(*(server.stop() for server in started))


def track(servers: list[ToolServer], server: ToolServer) -> ToolServer:
    servers.append(server)
    return server


async def test_concurrent_first_calls_share_one_start(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path))
    pids = await asyncio.gather(*(server.call_method("pid", {}) for _ in range(10)))
    assert len(set(pids)) == 1
    assert server.state is State.RUNNING and server.pid == pids[0]


async def test_crash_mid_call_fails_every_pending_call_at_once(
    tmp_path: Path, servers: list[ToolServer], caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.process")
    server = track(servers, fault_server(tmp_path))
    pid = await server.call_method("pid", {})
    slow = asyncio.ensure_future(server.call_method("sleep", {"seconds": 30}))
    started = time.monotonic()
    with pytest.raises(ToolServerUnavailable) as crash:
        await server.call_method("crash", {"code": 7})
    with pytest.raises(ToolServerUnavailable) as pending:
        await slow
    assert time.monotonic() - started < 10
    for error, method in ((crash.value, "crash"), (pending.value, "sleep")):
        wire = error.to_wire()
        assert wire["code"] == -32011 and wire["data"]["exit_status"] == 7 and wire["data"]["method"] == method
        # The child is every client's: what it wrote on stderr is the operators' (the daemon's log), not the caller's.
        assert "crashing" not in json.dumps(wire) and "stderr" not in json.dumps(wire)
    assert f"pid={pid} stderr: crashing" in caplog.text


async def test_exit_status_zero_mid_call_is_a_failure(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path))
    with pytest.raises(ToolServerUnavailable, match="exit status 0"):
        await server.call_method("crash", {"code": 0})


async def test_server_restarts_on_the_next_call_after_a_crash(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path))
    first = await server.call_method("pid", {})
    with pytest.raises(ToolServerUnavailable):
        await server.call_method("crash", {"code": 1})
    second = await server.call_method("pid", {})
    assert second != first and server.restarts == 1


async def test_too_many_crashes_leave_the_server_failed(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, max_restarts=1))
    for _ in range(2):
        with pytest.raises(ToolServerUnavailable):
            await server.call_method("crash", {"code": 1})
    assert server.state is State.FAILED
    started = time.monotonic()
    with pytest.raises(ToolServerFailed) as failed:
        await server.call_method("pid", {})
    assert time.monotonic() - started < 1.0
    assert failed.value.to_wire()["data"]["retryable"] is False
    server.reset()
    assert isinstance(await server.call_method("pid", {}), int)


async def test_hang_past_the_deadline_times_out(tmp_path: Path, servers: list[ToolServer]) -> None:
    methods = {**FAULT_METHODS, "sleep": {"timeout": "300ms"}}
    server = track(servers, fault_server(tmp_path, methods=methods))
    with pytest.raises(CallTimedOut) as timed_out:
        await server.call_method("sleep", {"seconds": 30})
    wire = timed_out.value.to_wire()
    assert wire["code"] == -32012 and wire["data"]["timeout"] == 0.3 and wire["data"]["retryable"] is True
    assert await server.call_method("echo", {"still": "alive"}) == {"still": "alive"}


async def test_mcp_timeout_sends_cancelled_to_the_child(tmp_path: Path, servers: list[ToolServer]) -> None:
    record = tmp_path / "received.jsonl"
    server = track(servers, fault_server(tmp_path, "--mcp", "--record", str(record), call_timeout="300ms"))
    with pytest.raises(CallTimedOut):
        await server.call_method("sleep", {"seconds": 30})

    def cancelled() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        return [m for m in lines if m.get("method") == "notifications/cancelled"]

    await eventually(lambda: bool(cancelled()), what="notifications/cancelled reached the child")
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    sleep_call = next(m for m in calls if m.get("method") == "tools/call")
    assert cancelled()[0]["params"]["requestId"] == sleep_call["id"]


async def test_non_json_stdout_is_dropped(tmp_path: Path, servers: list[ToolServer], caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    server = track(servers, fault_server(tmp_path, "--banner", "Welcome to faultsrv!"))
    assert await server.call_method("garbage", {}) == "ok"
    assert "stdout is not JSON, dropped" in caplog.text
    assert "Welcome to faultsrv!" in caplog.text


async def test_a_10_mib_line_works(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path))
    size = 10 * 1024 * 1024
    result = await server.call_method("huge", {"size": size})
    assert len(result) == size


async def test_a_large_answer_is_held_at_most_twice_while_it_is_read(tmp_path: Path, servers: list[ToolServer]) -> None:
    # Its pieces and their join, then its text and what it parses to: never its bytes, text and value at once (an
    # enumerate over the lines kept the bytes alive while they were parsed: 3×, bench.scale's payload goal's limit).
    server = track(servers, fault_server(tmp_path))
    await server.call_method("echo", {})
    size = 4 * 1024 * 1024
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = await server.call_method("huge", {"size": size})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result) == size
    assert peak - before < 2.5 * size


async def test_a_child_that_answers_in_bursts_larger_than_its_pipe_gets_a_wider_one(
    tmp_path: Path, servers: list[ToolServer]
) -> None:
    server = track(servers, fault_server(tmp_path))
    assert await server.call_method("echo", {"small": "answers"}) == {"small": "answers"}
    default = await server.call_method("pipe_size", {})
    assert default < CHILD_STDOUT_PIPE_BYTES  # small answers leave the kernel's default
    size = 8 * 1024 * 1024  # written in one go: the daemon's reads find the pipe full
    assert len(await server.call_method("huge", {"size": size})) == size
    assert await server.call_method("pipe_size", {}) == CHILD_STDOUT_PIPE_BYTES
    assert len(await server.call_method("huge", {"size": size})) == size


async def test_a_line_over_the_limit_is_dropped_and_the_next_one_works(
    tmp_path: Path, servers: list[ToolServer], caplog: Any
) -> None:
    caplog.set_level(logging.WARNING)
    methods = {**FAULT_METHODS, "huge": {"timeout": "2s"}}
    server = track(servers, fault_server(tmp_path, methods=methods))
    started = time.monotonic()
    # The dropped line's head names the call it answers: the call fails at once, not at its 2 s timeout.
    with pytest.raises(ToolServerUnavailable, match=f"answered huge with a line over {MAX_LINE_BYTES} bytes"):
        await server.call_method("huge", {"size": MAX_LINE_BYTES + 1})
    assert time.monotonic() - started < 2
    assert f"stdout line over {MAX_LINE_BYTES} bytes dropped" in caplog.text
    assert await server.call_method("echo", {"still": "alive"}) == {"still": "alive"}


@pytest.mark.parametrize("order", [
    "id_last",  # `{"jsonrpc":"2.0","result":"xx…","id":N}`: the head does not name the call; the line's end does
    "id_middle",  # `{"result":"xx…","id":N,"jsonrpc":"2.0"}`: neither does; it is a response, and one call waits
])
async def test_a_line_over_the_limit_whose_head_does_not_name_its_call_fails_it_once_it_ends(
    tmp_path: Path, servers: list[ToolServer], order: str
) -> None:
    methods = {**FAULT_METHODS, "huge": {"timeout": "5s"}}
    server = track(servers, fault_server(tmp_path, methods=methods))
    started = time.monotonic()
    with pytest.raises(ToolServerUnavailable, match=f"answered huge with a line over {MAX_LINE_BYTES} bytes"):
        await server.call_method("huge", {"size": MAX_LINE_BYTES + 1, order: True})
    assert time.monotonic() - started < 5
    assert await server.call_method("echo", {"still": "alive"}) == {"still": "alive"}


async def test_response_with_unknown_id_is_dropped(tmp_path: Path, servers: list[ToolServer], caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    server = track(servers, fault_server(tmp_path))
    assert await server.call_method("wrong_id", {}) == "ok"
    assert "unknown id 'no-such-id-999' dropped" in caplog.text


async def test_stderr_flood_is_rate_limited(tmp_path: Path, servers: list[ToolServer], caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.process")
    server = track(servers, fault_server(tmp_path))
    assert await server.call_method("stderr_flood", {"lines": 5000}) == "ok"
    await server.stop()
    logged = [r for r in caplog.records if "stderr:" in r.getMessage() and "not logged" not in r.getMessage()]
    assert 0 < len(logged) < 1000
    assert "lines not logged (rate limit)" in caplog.text or len(logged) < 5000


async def test_idle_child_is_stopped_and_starts_again(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, idle_timeout="300ms"))
    first = await server.call_method("pid", {})
    await eventually(lambda: server.state is State.STOPPED, what="idle stop")
    assert process_gone(first)
    second = await server.call_method("pid", {})
    assert second != first and server.restarts == 0


async def test_a_call_in_flight_keeps_an_idle_child_alive(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, idle_timeout="200ms"))
    pid = await server.call_method("pid", {})
    assert await server.call_method("sleep", {"seconds": 0.6}) == {"slept": 0.6}
    assert server.pid == pid


async def test_over_max_in_flight_and_queue_is_overloaded(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, max_in_flight=1, max_queued=1))
    busy = asyncio.ensure_future(server.call_method("sleep", {"seconds": 1}))
    await eventually(lambda: server.status()["in_flight"] == 1)
    queued = asyncio.ensure_future(server.call_method("echo", {"n": 1}))
    await eventually(lambda: server.status()["waiting"] == 1)
    with pytest.raises(Overloaded) as overloaded:
        await server.call_method("echo", {"n": 2})
    assert overloaded.value.to_wire()["code"] == -32014
    assert await busy == {"slept": 1} and await queued == {"n": 1}


async def test_stop_kills_grandchildren(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path))
    child = await server.call_method("pid", {})
    grandchild = (await server.call_method("grandchild", {}))["pid"]
    assert not process_gone(grandchild)
    await server.stop()
    await eventually(lambda: process_gone(child) and process_gone(grandchild), what="child and grandchild gone")


async def test_stop_escalates_to_sigkill(tmp_path: Path, servers: list[ToolServer]) -> None:
    stubborn = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('{\"jsonrpc\":\"2.0\",\"method\":\"ready\"}', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    config = ServerConfig(command=[sys.executable, "-c", stubborn], protocol="jsonrpc", methods={"x": {}})
    server = track(servers, ToolServer("stubborn", config, tmp_path))
    conn = await server.ensure_running()
    started = time.monotonic()
    await server.stop()
    assert process_gone(conn.pid)
    assert conn.exit_info is not None and conn.exit_info.returncode == -9
    assert time.monotonic() - started < 15


async def test_a_command_that_does_not_exist(tmp_path: Path, servers: list[ToolServer]) -> None:
    config = ServerConfig(command=["/nonexistent/tool-server"], protocol="jsonrpc", methods={"x": {}})
    server = track(servers, ToolServer("ghost", config, tmp_path))
    with pytest.raises(ToolServerUnavailable, match="could not start"):
        await server.call_method("x", {})


async def test_mcp_server_that_dies_during_the_handshake(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, "--mcp", "--crash-on-start"))
    with pytest.raises(ToolServerUnavailable, match="exit status 3"):
        await server.call_method("echo", {})


async def test_mcp_handshake_lists_tools_and_follows_list_changed(tmp_path: Path, servers: list[ToolServer]) -> None:
    changed: list[str] = []
    config = fault_server(tmp_path, "--mcp").config
    server = track(servers, ToolServer("fault", config, tmp_path, on_tools_changed=changed.append))
    names = [tool.method for tool in await server.tools()]
    assert "echo" in names and "extra" not in names
    await server.call_method("change_tools", {})
    await eventually(lambda: changed == ["fault"], what="list_changed callback")
    assert "extra" in [tool.method for tool in await server.tools()]


async def test_progress_reaches_the_call_with_the_gateway_token(tmp_path: Path, servers: list[ToolServer]) -> None:
    server = track(servers, fault_server(tmp_path, "--mcp"))
    events: list[dict[str, Any]] = []
    result = await server.call_method("progress", {"steps": 3}, Delivery(on_event=events.append, progress=True))
    assert result["structuredContent"] == {"value": {"steps": 3}}
    progress = [e["params"] for e in events if e["method"] == "notifications/progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert len({p["progressToken"] for p in progress}) == 1
    assert any(e["method"] == "notifications/message" for e in events)


async def test_child_environment_is_minimal_plus_config(tmp_path: Path, servers: list[ToolServer],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAYD_TEST_SECRET", "must-not-leak")
    server = track(servers, fault_server(tmp_path, env={"TOOL_SETTING": "on"}))
    assert await server.call_method("env", {"name": "TOOL_SETTING"}) == "on"
    assert await server.call_method("env", {"name": "GATEWAYD_TEST_SECRET"}) is None


ASKING_CHILD = """
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\\n")
    sys.stdout.flush()
send({"jsonrpc": "2.0", "id": "c1", "method": "ping"})
send({"jsonrpc": "2.0", "id": "c2", "method": "roots/list"})
got, report = {}, None
for line in sys.stdin:
    m = json.loads(line)
    if m.get("id") in ("c1", "c2"):
        got[m["id"]] = m
    elif m.get("method") == "report":
        report = m["id"]
    if report is not None and len(got) == 2:
        send({"jsonrpc": "2.0", "id": report, "result": got})
        report = None
"""


async def test_requests_from_the_child_are_answered_never_left_waiting(
    tmp_path: Path, servers: list[ToolServer]
) -> None:
    config = ServerConfig(command=[sys.executable, "-c", ASKING_CHILD], protocol="jsonrpc", methods={"report": {}})
    server = track(servers, ToolServer("asking", config, tmp_path))
    got = await server.call_method("report", {})
    assert got["c1"] == {"jsonrpc": "2.0", "id": "c1", "result": {}}
    assert got["c2"]["error"]["code"] == -32601


async def test_a_gone_child_s_objects_go_by_their_reference_counts(tmp_path: Path) -> None:
    """Stopped, idled out or dead during a call: the child's connection, peer and process are freed with the collector
    off, not left in reference cycles for it (a stopped child's ~100 objects were, each time; bench/soak.py)."""
    gc.collect()
    gc.disable()
    try:
        for how in ("stop", "idle", "crash"):
            await _gone_and_freed(tmp_path, how)
    finally:
        gc.enable()


async def _gone_and_freed(tmp_path: Path, how: str) -> None:
    server = fault_server(tmp_path, idle_timeout="200ms" if how == "idle" else 0)
    assert await server.call_method("echo", {"n": 1}) == {"n": 1}
    conn = server._conn
    assert conn is not None
    held = [weakref.ref(thing) for thing in (conn, conn._peer, conn._process)]
    del conn
    if how == "stop":
        await server.stop()
    elif how == "crash":
        with pytest.raises(ToolServerUnavailable, match="exited during crash"):
            await server.call_method("crash", {})
    await eventually(lambda: server.state is State.STOPPED, what=f"the child is gone ({how})")
    await eventually(lambda: all(ref() is None for ref in held), what=f"its objects are freed ({how})")
    await server.stop()
