"""One client must not be able to hurt the others through connections, file descriptors or bad headers.

Over real loopback sockets: idle and trickling sockets that never present a token are kept to their
share, evicted for newcomers and closed after their idle deadline, while clients with a token connect
and call at once; headers with raw bytes 0x80-0xff or control characters get a 4xx and no ERROR line.
With the real daemon as a subprocess: an open-file limit too small for `max_connections` lowers the
cap (one WARNING) instead of running out of descriptors, the admin socket answers with the public port
at its cap, and accept failing with EMFILE does not flood the log. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import resource
import shlex
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gatewayd import app
from gatewayd.admin import AdminClient
from gatewayd.settings import Settings
from gatewayd.web import limits
from gatewayd.web.auth import AUTH_RECORDS_PER_INTERVAL
from gatewayd.web.limits import EVICTION_GRACE, LimitedServer, LoopErrorLimit, descriptor_reserve
from tests.daemon import Daemon, gatewayctl, headers, write_config
from tests.e2e.test_systemd import UNIT, Unit
from tests.stack import LocalClient, running_daemon, running_stack
from tests.waiting import eventually
from tests.web.test_limits import (
    CALC,
    DEADLINE,
    ROLES,
    Stack,
    read_response,
    read_until_closed,
    stack_fixture,
    status_of,
)

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

# The unauthenticated share in these tests: small, so crossing it takes few sockets.
SHARE = 8
# Sockets opened beyond the share.
BEYOND = 4
# The idle deadline in these tests: short, yet long enough that a loaded machine answers a request well within it.
IDLE = 0.5
# The idle deadline where sockets must stay open until newcomers evict them: opening the share's sockets and those
# beyond it must end well within it (a loaded CI machine took over 1.5 s, and the idle sweep got there first).
EVICTION_IDLE = 3.0
# Longest a test watches for something that must not happen (a log flood).
QUIET_WINDOW = 3.0
# Connections the daemon under a small open-file limit may still hold.
FITTED_CAP = 8
# A generous deployment: the shipped unit's LimitNOFILE must hold the default cap with this many tool servers.
GENEROUS_TOOL_SERVERS = 100


async def open_many(stack: Stack, count: int) -> list[Connection]:
    return [await stack.connect() for _ in range(count)]


async def closed_by_server(connection: Connection) -> bytes:
    async with asyncio.timeout(DEADLINE):
        return await read_until_closed(connection[0])


def close_all(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()


def warnings(caplog: Any, text: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno == logging.WARNING and text in record.getMessage()]


async def old_enough_to_evict(admitted: float) -> None:
    """Until connections the server admitted by `admitted` (event-loop time) may be closed to make room."""
    loop = asyncio.get_running_loop()
    await eventually(lambda: loop.time() > admitted + EVICTION_GRACE, DEADLINE, "the eviction grace over")


async def admitted_and_old_enough(server: LimitedServer, unauthenticated: int) -> None:
    """Until the server counts `unauthenticated` connections and each may be closed to make room.

    A socket's connect returns once the kernel has it; the server admits it (and starts its wait) when its own loop
    gets there, which on a loaded machine is later than the client's clock says.
    """
    await eventually(lambda: server.unauthenticated_connections == unauthenticated, DEADLINE, "all admitted")
    await old_enough_to_evict(asyncio.get_running_loop().time())


# -- the unauthenticated share and its idle deadline -------------------------------------------------


class Served(Stack):
    """A Stack that also sees its HTTP server's connection counts."""

    def __init__(self, client: LocalClient, daemon: app.Daemon, tokens: dict[str, str]) -> None:
        super().__init__(client, daemon.state, tokens)
        # The runner is the daemon's own business; only these tests look at its counts.
        server = daemon._runner.server
        assert isinstance(server, LimitedServer)
        self.server = server


def served_fixture(**settings: Any) -> Any:
    """A fixture running the daemon in-process with these settings; clients `alice` and `bob`."""

    @pytest.fixture
    async def fixture(tmp_path: Path) -> AsyncIterator[Served]:
        tokens = write_config(tmp_path, {"calc": CALC}, ROLES, {"alice": ["all"], "bob": ["all"]})
        async with running_daemon(tmp_path, **settings) as (client, daemon):
            yield Served(client, daemon, tokens)

    return fixture


share = served_fixture(max_unauthenticated_connections=SHARE, unauthenticated_idle_timeout=IDLE)
evicting = served_fixture(max_unauthenticated_connections=SHARE, unauthenticated_idle_timeout=EVICTION_IDLE)


async def test_idle_sockets_past_the_share_cannot_lock_out_a_client_with_a_token(evicting: Served, caplog: Any) -> None:
    share = evicting
    loop = asyncio.get_running_loop()
    client = await share.connect()
    async with asyncio.timeout(DEADLINE):
        assert await share.call_on(*client) == 200
    opened = loop.time()
    idle = await open_many(share, SHARE)
    await admitted_and_old_enough(share.server, SHARE)
    idle += await open_many(share, BEYOND)
    # The longest-waiting ones made room for the newest: closed without a word (they had sent nothing).
    for connection in idle[:BEYOND]:
        assert await closed_by_server(connection) == b""
    assert loop.time() - opened < EVICTION_IDLE, "too slow to tell evictions from the idle sweep"
    assert share.server.unauthenticated_connections == SHARE
    # A client with a token connects and is served at once, though the share is full of idle sockets.
    await share.add("bob")
    # Five evictions, one line.
    assert len(warnings(caplog, "each new one closes")) == 1
    # The idle ones left are closed once their deadline passes, not before.
    for connection in idle[BEYOND:]:
        assert await closed_by_server(connection) == b""
    assert loop.time() - opened >= EVICTION_IDLE
    await eventually(lambda: share.server.unauthenticated_connections == 0, DEADLINE, "idle sockets counted out")
    # The authenticated connection, idle longer than any of them, is still open and served.
    async with asyncio.timeout(DEADLINE):
        assert await share.call_on(*client) == 200
    close_all([*idle, client])
    await share.client.session.close()
    await eventually(lambda: share.server.open_connections == 0, DEADLINE, "every connection counted out")


async def test_a_burst_of_connections_past_the_share_is_answered_not_dropped(share: Served) -> None:
    # All admitted before any request is read: none may be closed unanswered to make room for the next.
    burst = await open_many(share, SHARE + BEYOND)
    for _, writer in burst:
        writer.write(share.request_head("GET", "/healthz", Connection="close"))
    answers = [status_of(await closed_by_server(connection)) for connection in burst]
    assert set(answers) <= {200, 503} and answers.count(200) >= SHARE, answers
    close_all(burst)


async def test_an_unauthenticated_connection_is_closed_when_idle_after_its_response(share: Served) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await share.connect()
    async with asyncio.timeout(DEADLINE):
        writer.write(share.request_head("GET", "/healthz"))
        assert await read_response(reader) == (200, b"ok\n")
        answered = loop.time()
        # A wrong token leaves it unauthenticated.
        writer.write(share.request_head("GET", "/mcp", Authorization="Bearer gwd_wrong"))
        assert (await read_response(reader))[0] == 401
    assert await closed_by_server((reader, writer)) == b""
    assert loop.time() - answered >= IDLE
    writer.close()


async def test_trickling_sockets_are_evicted_too_and_told_503(share: Served) -> None:
    # Slow-loris sockets sending their headers byte by byte must not hold the share either.
    trickling = await open_many(share, SHARE)
    for _, writer in trickling:
        writer.write(share.request_head("GET", "/healthz")[:10])
    await admitted_and_old_enough(share.server, SHARE)
    newcomer = await share.connect()
    refused = await closed_by_server(trickling[0])
    assert status_of(refused) == 503 and b"Retry-After: 1" in refused
    async with asyncio.timeout(DEADLINE):
        newcomer[1].write(share.request_head("GET", "/healthz"))
        assert await read_response(newcomer[0]) == (200, b"ok\n")
    close_all([*trickling, newcomer])


few = served_fixture(max_connections=3, max_unauthenticated_connections=SHARE)


async def test_authenticated_connections_are_never_closed_to_make_room(few: Served, caplog: Any) -> None:
    clients = await open_many(few, 3)
    async with asyncio.timeout(DEADLINE):
        for connection in clients:
            assert await few.call_on(*connection) == 200
    # Long enough idle that an unauthenticated connection would be closed to make room.
    await old_enough_to_evict(asyncio.get_running_loop().time())
    async with asyncio.timeout(DEADLINE):
        for _ in range(3):
            refused = await closed_by_server(await few.connect())
            assert status_of(refused) == 503 and b"Retry-After: 1" in refused
    assert len(warnings(caplog, "refusing new connections")) == 1
    # With the public port at its cap, the admin socket still answers.
    admin = AdminClient(few.state.settings.admin_socket_path() or Path("/nonexistent"))
    status, body = await admin.call("GET", "/status")
    assert status == 200 and body["servers"], body
    for connection in clients:
        async with asyncio.timeout(DEADLINE):
            assert await few.call_on(*connection) == 200
    close_all(clients)


async def test_at_the_connection_cap_newcomers_take_an_idle_sockets_place_and_it_is_logged_once(
    few: Served, caplog: Any
) -> None:
    clients = await open_many(few, 2)
    async with asyncio.timeout(DEADLINE):
        for connection in clients:
            assert await few.call_on(*connection) == 200
    idle = [await few.connect()]
    await admitted_and_old_enough(few.server, 1)
    for _ in range(3):
        idle.append(await few.connect())
        # Closed when the newcomer was admitted: from here on the newcomer waits.
        assert await closed_by_server(idle[-2]) == b""
        await old_enough_to_evict(asyncio.get_running_loop().time())
    assert len(warnings(caplog, "each new one closes")) == 1
    close_all([*clients, *idle])


# -- bad header bytes: a 4xx, never a 500 or a traceback ---------------------------------------------

HIGH_BYTES = [b"\x80", b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"gwd_\xfe\xff"]
CONTROL_BYTES = [b"\x00", b"\x01", b"\x1b", b"\x7f", b"a\rb"]
READ_HEADERS = ["Authorization", "Mcp-Session-Id", "MCP-Protocol-Version", "Accept", "Host", "Origin", "Content-Type"]

defaults = stack_fixture()


def raw_request(stack: Stack, method: str, header: str, value: bytes) -> bytes:
    body = b"" if method != "POST" else json_call()
    fields = {"Host": stack.host.encode(), **{k: v.encode() for k, v in stack.headers().items()},
              "Accept": b"application/json, text/event-stream", "Content-Length": str(len(body)).encode()}
    fields[header] = value
    lines = [f"{method} /mcp HTTP/1.1".encode(), *(name.encode() + b": " + v for name, v in fields.items())]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def json_call() -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"nosuch.method"}'


async def status_for(stack: Stack, request: bytes) -> int:
    reader, writer = await stack.connect()
    writer.write(request)
    async with asyncio.timeout(DEADLINE):
        answer = await reader.readuntil(b"\r\n")
    writer.close()
    return status_of(answer)


async def test_bad_bytes_in_any_header_read_get_a_4xx_and_no_error_log(defaults: Stack, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    seen: dict[tuple[str, str, bytes], int] = {}
    for method in ("POST", "GET", "DELETE"):
        for header in READ_HEADERS:
            for bad in (*HIGH_BYTES, *(b"x" + byte + b"y" for byte in CONTROL_BYTES)):
                prefix = b"Bearer " if header == "Authorization" and bad in HIGH_BYTES else b""
                seen[(method, header, bad)] = await status_for(defaults, raw_request(defaults, method, header,
                                                                                      prefix + bad))
    assert all(400 <= status < 500 for status in seen.values()), {k: v for k, v in seen.items() if v >= 500}
    # A token that is not UTF-8 is a wrong token, with every method.
    assert {seen[(method, "Authorization", bad)] for method in ("POST", "GET", "DELETE") for bad in HIGH_BYTES} == {401}
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    await defaults.add()


async def test_a_flood_of_0xff_tokens_gets_401s_and_logs_only_the_first_few(defaults: Stack, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    reader, writer = await defaults.connect()
    request = raw_request(defaults, "POST", "Authorization", b"Bearer \xff")
    async with asyncio.timeout(DEADLINE):
        for _ in range(200):
            writer.write(request)
            status, _ = await read_response(reader)
            assert status == 401
    writer.close()
    # Each is a failed login (web/auth.py): logged, but only the first few of a minute.
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == AUTH_RECORDS_PER_INTERVAL and all(w.startswith("401 for POST") for w in warnings), warnings


# -- the event loop's error reports ------------------------------------------------------------------

ACCEPT_FAILED = "socket.accept() out of system resource"


def accept_failure() -> dict[str, Any]:
    return {"message": ACCEPT_FAILED, "exception": OSError(errno.EMFILE, "Too many open files")}


def asyncio_errors(caplog: Any, text: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= logging.ERROR and text in record.getMessage()]


async def test_repeated_loop_error_reports_are_logged_a_few_times_then_counted(caplog: Any) -> None:
    loop = asyncio.get_running_loop()
    window = 0.3
    handler = LoopErrorLimit(per_window=5, window=window)
    for _ in range(1000):
        handler(loop, accept_failure())
    handler(loop, {"message": "Task exception was never retrieved", "exception": ValueError("x")})
    assert len(asyncio_errors(caplog, ACCEPT_FAILED)) == 5
    # Another kind has its own allowance.
    assert len(asyncio_errors(caplog, "never retrieved")) == 1
    await eventually(lambda: bool(asyncio_errors(caplog, "995 more")), DEADLINE, "the count of the rest")
    assert len(asyncio_errors(caplog, "more event loop error reports")) == 1
    # A new window logs again.
    handler(loop, accept_failure())
    assert len(asyncio_errors(caplog, ACCEPT_FAILED)) == 7  # 5, the count line naming it, and this one


async def test_callback_reports_differing_only_in_their_repr_are_one_kind(caplog: Any) -> None:
    loop = asyncio.get_running_loop()
    handler = LoopErrorLimit(per_window=2, window=60.0)
    for when in range(50):
        handler(loop, {"message": f"Exception in callback <TimerHandle when={when} f()>", "exception": KeyError(when)})
    assert len(asyncio_errors(caplog, "Exception in callback")) == 2


def test_the_limit_is_installed_once_over_the_existing_handler() -> None:
    seen: list[dict[str, Any]] = []

    async def start_twice() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(context))
        limits.limit_loop_error_reports()
        limits.limit_loop_error_reports()
        handler = loop.get_exception_handler()
        assert isinstance(handler, LoopErrorLimit)
        for _ in range(100):
            loop.call_exception_handler(accept_failure())

    asyncio.run(start_twice())
    # Delegated to the handler it replaced, and limited once, not twice.
    assert len(seen) == limits.LOOP_REPORTS_PER_WINDOW


# -- the open-file limit against the connection cap ---------------------------------------------------


def test_the_unit_gives_the_default_connection_cap_its_descriptors() -> None:
    unit = Unit(UNIT.read_text())
    default_cap = Settings.model_fields["max_connections"].default
    assert int(unit.value("LimitNOFILE")) >= default_cap + descriptor_reserve(GENEROUS_TOOL_SERVERS)


async def test_a_low_soft_limit_is_raised_as_far_as_the_cap_needs(tmp_path: Path, caplog: Any) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"alice": ["all"]})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = Settings.model_fields["max_connections"].default
    wanted = cap + descriptor_reserve(1)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-file limit {hard} is below the {wanted} the default cap needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, wanted // 2), hard))
    try:
        async with running_stack(tmp_path):
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


@asynccontextmanager
async def daemon_under_ulimit(config_dir: Path, nofile: int) -> AsyncIterator[Daemon]:
    """The real daemon started as by `ulimit -n NOFILE; gatewayd ...` (soft and hard limit)."""
    wrapper = config_dir / "python-ulimit"
    wrapper.write_text(f'#!/bin/sh\nulimit -n {nofile} || exit 1\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    daemon = Daemon(config_dir, "--watch-config", "false")
    # The harness runs `sys.executable -m gatewayd`: point it at the wrapper just while the daemon starts.
    real, sys.executable = sys.executable, str(wrapper)
    try:
        await daemon.__aenter__()
    finally:
        sys.executable = real
    try:
        yield daemon
    finally:
        await daemon.stop()


class Raw:
    """Raw connections to a subprocess daemon's public port."""

    def __init__(self, url: str, token: str) -> None:
        self.host = url.split("/")[2]
        self.port = int(self.host.rsplit(":", 1)[1])
        self.token = token

    async def connect(self) -> Connection:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def call_on(self, connection: Connection) -> int:
        body = json_call()
        fields = {"Host": self.host, **headers(self.token), "Content-Length": str(len(body))}
        head = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
        connection[1].write(head.encode() + body)
        async with asyncio.timeout(DEADLINE):
            status, _ = await read_response(connection[0])
        return status


def count_lines(daemon: Daemon, text: str) -> int:
    return sum(text in line for line in daemon.logs)


async def test_an_open_file_limit_too_small_lowers_the_cap_and_the_admin_socket_still_answers(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"calc": CALC}, ROLES, {"alice": ["all"]})
    reserve = descriptor_reserve(1)
    cap = Settings.model_fields["max_connections"].default
    async with daemon_under_ulimit(tmp_path, reserve + FITTED_CAP) as daemon:
        warning = await daemon.wait_log("open-file limit")
        assert "WARNING" in warning and "LimitNOFILE" in warning
        assert f"open-file limit {reserve + FITTED_CAP} leaves room for {FITTED_CAP} client connections" in warning
        assert f"max_connections={cap}" in warning and f"at least {cap + reserve}" in warning
        raw = Raw(daemon.url, tokens["alice"])
        clients = [await raw.connect() for _ in range(FITTED_CAP)]
        for connection in clients:
            assert await raw.call_on(connection) == 200
        await old_enough_to_evict(asyncio.get_running_loop().time())
        refused = await closed_by_server(await raw.connect())
        assert status_of(refused) == 503
        code, out, err = await gatewayctl(tmp_path, "status")
        assert code == 0, err
        assert "calc" in out
        for connection in clients:
            assert await raw.call_on(connection) == 200
        close_all(clients)
        assert count_lines(daemon, ACCEPT_FAILED) == 0


async def stays_false(condition: Callable[[], bool], daemon: Daemon, window: float) -> None:
    """Fail as soon as `condition()` holds, checking at each log line of the daemon's for `window` seconds."""
    loop = asyncio.get_running_loop()
    until = loop.time() + window
    while (left := until - loop.time()) > 0:
        assert not condition()
        daemon.log_event.clear()
        try:
            async with asyncio.timeout(left):
                await daemon.log_event.wait()
        except TimeoutError:
            break
    assert not condition()


async def test_accept_failing_for_want_of_descriptors_does_not_flood_the_log(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"calc": CALC}, ROLES, {"alice": ["all"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        try:
            # Room for one more descriptor: the next connections cannot even be accepted.
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{pid}/fd")) + 1, hard))
        except PermissionError:
            pytest.skip("this user may not change the daemon's open-file limit (prlimit)")
        raw = Raw(daemon.url, tokens["alice"])
        waiting = [await raw.connect() for _ in range(20)]
        await daemon.wait_log(re.escape(ACCEPT_FAILED))
        # Python 3.11 retries the accept for the whole backlog each second: hundreds of tracebacks a second unlimited.
        await stays_false(lambda: count_lines(daemon, ACCEPT_FAILED) > limits.LOOP_REPORTS_PER_WINDOW, daemon,
                          QUIET_WINDOW)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        close_all(waiting)
        # Served again once descriptors are back.
        connection = await raw.connect()
        assert await raw.call_on(connection) == 200
        close_all([connection])
