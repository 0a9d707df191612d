"""gatewayd under systemd: the notify protocol spoken by the real daemon, and the unit file in systemd/.

The service manager is played by a real unix datagram socket named in $NOTIFY_SOCKET (a path, or "@name" in
the abstract namespace), read without blocking through the event loop, every read under a deadline. Starting
the unit itself needs systemd as PID 1, which a test machine does not have; the unit is checked by parsing it
and by `systemd-analyze` (skipped where that is not installed).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gatewayd import systemd
from gatewayd.settings import Settings
from gatewayd.upstream.process import SIGKILL_GRACE, SIGTERM_GRACE, STDIN_CLOSE_GRACE
from tests.daemon import (
    GATEWAYCTL_DEADLINE,
    REPO,
    Daemon,
    daemon_env,
    gatewayctl,
    python_command,
    write_config,
)

UNIT = REPO / "systemd" / "gatewayd.service"
SYSTEMD_ANALYZE = Path("/usr/bin/systemd-analyze")
# The goal for `systemd-analyze security`: 0 is a sealed box, 10 an unconfined root service.
MAX_EXPOSURE = 2.5
# `systemd-analyze` reads a few unit files; a minute means it hangs, not that the machine is slow.
ANALYZE_DEADLINE = 60.0
# Time for one datagram the daemon owes us (READY after start, STOPPING after SIGTERM); generous for a loaded CI box.
NOTIFY_DEADLINE = 20.0
# WATCHDOG_USEC given to the daemon: it pings every half of it, 0.1 s.
WATCHDOG_USEC = 200_000
WATCHDOG_PING_INTERVAL = WATCHDOG_USEC / 1_000_000 * systemd.WATCHDOG_FRACTION
# Pings wanted from the live daemon, and the time they may take: 3 take 0.2 s, the rest is room for a busy machine.
WATCHDOG_PINGS = 3
WATCHDOG_PINGS_DEADLINE = 2.0
# How long a daemon told to leave the watchdog to another process is watched for pings that must not come.
QUIET_WINDOW = 5 * WATCHDOG_PING_INTERVAL
# Largest notify message we expect; systemd itself accepts a few KiB.
DATAGRAM_BYTES = 4096
# Bound on the quiet-window probing of the daemon.
HTTP_DEADLINE = 30.0

CALC = python_command("-m", "gatewayd.examples.calc") + '\nprotocol = "jsonrpc"\n[methods.add]\n'


# -- a stand-in for the service manager's notify socket ------------------------------------------


class NotifySocket:
    """A bound unix datagram socket that collects `KEY=VALUE` messages, as systemd's notify socket does."""

    def __init__(self, address: str) -> None:
        """`address` as it goes into $NOTIFY_SOCKET: a file system path, or "@name" for the abstract namespace."""
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setblocking(False)
        self.messages: list[dict[str, str]] = []

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def parse(datagram: bytes) -> dict[str, str]:
        fields: dict[str, str] = {}
        for line in datagram.decode("utf-8").split("\n"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=VALUE: {line!r} in {datagram!r}"
            fields[key] = value
        return fields

    async def next(self, timeout: float = NOTIFY_DEADLINE) -> dict[str, str]:
        """The next message, waiting for it up to `timeout` seconds."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            message = self.parse(await loop.sock_recv(self.sock, DATAGRAM_BYTES))
        self.messages.append(message)
        return message

    async def until(self, key: str, value: str = "1", timeout: float = NOTIFY_DEADLINE) -> dict[str, str]:
        """Read messages until one carries `key=value`; return that one."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.next()
                if message.get(key) == value:
                    return message

    def drain(self) -> list[dict[str, str]]:
        """Every message queued right now, without waiting: a datagram is queued here once its send returns."""
        received = []
        while True:
            try:
                datagram = self.sock.recv(DATAGRAM_BYTES)
            except BlockingIOError:
                break
            received.append(self.parse(datagram))
        self.messages.extend(received)
        return received

    def count(self, key: str, value: str = "1") -> int:
        return sum(1 for message in self.messages if message.get(key) == value)


@pytest.fixture
def notify_path(tmp_path: Path) -> Iterator[NotifySocket]:
    path = tmp_path / "notify"
    assert len(str(path)) < 100, "a unix socket path must fit in sun_path"
    listener = NotifySocket(str(path))
    yield listener
    listener.close()


@pytest.fixture
def notify_abstract() -> Iterator[NotifySocket]:
    listener = NotifySocket(f"@gatewayd-test-{os.getpid()}-{secrets.token_hex(6)}")
    yield listener
    listener.close()


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    root = tmp_path / "config"
    write_config(root, {"calc": CALC})
    return root


def no_watchdog() -> dict[str, str]:
    """Environment that turns the watchdog off whatever the test runner inherited (empty counts as unset)."""
    return {"WATCHDOG_USEC": "", "WATCHDOG_PID": ""}


def served_url(status: str) -> str:
    """The endpoint named by the READY message's STATUS line."""
    match = re.search(r"http://\S+?/mcp", status)
    assert match, f"STATUS does not say where it serves: {status!r}"
    return match.group(0)


async def healthz(http: aiohttp.ClientSession, mcp_url: str) -> None:
    """One round trip through the daemon's event loop."""
    async with http.get(mcp_url.removesuffix("/mcp") + "/healthz") as response:
        assert response.status == 200, await response.text()


# -- a. READY and STOPPING from the real daemon -------------------------------------------------


async def test_ready_comes_once_it_listens_and_stopping_before_it_exits(
    config_dir: Path, notify_path: NotifySocket, http: aiohttp.ClientSession
) -> None:
    async def ready_then_probe() -> dict[str, str]:
        """At the moment READY=1 arrives, the HTTP port and the admin socket must already accept connections."""
        ready = await notify_path.until("READY")
        url = served_url(ready["STATUS"])
        host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.close()
        _, writer = await asyncio.open_unix_connection(str(config_dir / "gatewayd.sock"))
        writer.close()
        return ready

    probe = asyncio.create_task(ready_then_probe())
    try:
        async with Daemon(config_dir, env={"NOTIFY_SOCKET": notify_path.address, **no_watchdog()}) as daemon:
            ready = await probe
            assert ready["STATUS"].startswith("serving "), ready
            assert served_url(ready["STATUS"]) == daemon.url
            assert "1 tool server" in ready["STATUS"] and "1 tool servers" not in ready["STATUS"]
            await healthz(http, daemon.url)
            assert not any("STOPPING" in message for message in notify_path.drain())

            assert await daemon.stop(signal.SIGTERM) == 0
            # The daemon has exited: whatever it sent is already queued here, so no waiting.
            after = notify_path.drain()
    finally:
        probe.cancel()
    stopping = [message for message in after if message.get("STOPPING") == "1"]
    assert len(stopping) == 1, after
    assert stopping[0].get("STATUS", "").startswith("stopping"), stopping
    assert notify_path.count("READY") == 1, notify_path.messages
    assert notify_path.messages.index(ready) < notify_path.messages.index(stopping[0])


async def test_a_reload_says_reloading_then_ready(config_dir: Path, notify_path: NotifySocket) -> None:
    async with Daemon(config_dir, "--watch-config", "false",
                      env={"NOTIFY_SOCKET": notify_path.address, **no_watchdog()}) as daemon:
        await notify_path.until("READY")
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        code, _, err = await gatewayctl(config_dir, "reload")
        assert code == 0, err
        reloading = await notify_path.until("RELOADING")
        ready = await notify_path.until("READY")
        assert before <= int(reloading["MONOTONIC_USEC"]) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert reloading["STATUS"].startswith("reloading")
        # After a reload the STATUS line still says where it serves.
        assert ready["STATUS"].startswith("serving ") and served_url(ready["STATUS"]) == daemon.url
        assert "generation 1, 1 tool server" in ready["STATUS"] and "tool servers" not in ready["STATUS"]


# -- b. an abstract-namespace socket -------------------------------------------------------------


async def test_an_abstract_notify_socket_works_too(config_dir: Path, notify_abstract: NotifySocket) -> None:
    assert notify_abstract.address.startswith("@")
    async with Daemon(config_dir, env={"NOTIFY_SOCKET": notify_abstract.address, **no_watchdog()}) as daemon:
        ready = await notify_abstract.until("READY")
        assert served_url(ready["STATUS"]) == daemon.url
        assert await daemon.stop(signal.SIGTERM) == 0
    assert any(message.get("STOPPING") == "1" for message in notify_abstract.drain())


# -- c. the watchdog -----------------------------------------------------------------------------


async def test_the_daemon_pings_the_watchdog_from_its_loop(
    config_dir: Path, notify_path: NotifySocket, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    started = time.monotonic()
    async with Daemon(config_dir, env={"NOTIFY_SOCKET": notify_path.address,
                                       "WATCHDOG_USEC": str(WATCHDOG_USEC)}) as daemon:
        await notify_path.until("READY")
        # The first ping goes out as the daemon's loop turns after READY, before it can answer anything.
        await healthz(http, daemon.url)
        notify_path.drain()
        assert notify_path.count("WATCHDOG") >= 1, notify_path.messages
        async with asyncio.timeout(WATCHDOG_PINGS_DEADLINE):
            while notify_path.count("WATCHDOG") < WATCHDOG_PINGS:
                await notify_path.next()
        # Paced, not flooding: no more pings than the interval allows since before the daemon started.
        allowed = (time.monotonic() - started) / WATCHDOG_PING_INTERVAL + 2
        assert notify_path.count("WATCHDOG") <= allowed, (notify_path.count("WATCHDOG"), allowed)
        assert await daemon.stop(signal.SIGTERM) == 0


async def test_no_pings_when_the_watchdog_belongs_to_another_process(
    config_dir: Path, notify_path: NotifySocket, http: aiohttp.ClientSession
) -> None:
    # This test process is alive and is not the daemon: systemd would be watching it, not the daemon.
    env = {"NOTIFY_SOCKET": notify_path.address, "WATCHDOG_USEC": str(WATCHDOG_USEC), "WATCHDOG_PID": str(os.getpid())}
    async with Daemon(config_dir, env=env) as daemon:
        await notify_path.until("READY")
        ready_at = time.monotonic()
        # Keep the daemon's loop busy answering for several ping intervals; any ping would be queued by then.
        async with asyncio.timeout(HTTP_DEADLINE):
            while time.monotonic() - ready_at < QUIET_WINDOW:
                await healthz(http, daemon.url)
        assert await daemon.stop(signal.SIGTERM) == 0
    notify_path.drain()
    assert notify_path.count("READY") == 1 and notify_path.count("STOPPING") == 1, notify_path.messages
    assert notify_path.count("WATCHDOG") == 0, notify_path.messages


# -- d. the unit file ---------------------------------------------------------------------------


class Unit:
    """A systemd unit file read the way systemd reads it: sections, repeated keys, `Key=` resets a list."""

    def __init__(self, text: str) -> None:
        self.sections: dict[str, dict[str, list[str]]] = {}
        section: dict[str, list[str]] | None = None
        pending = ""
        for raw in text.splitlines():
            line = (pending + raw.strip()) if pending else raw.strip()
            pending = ""
            if not line or line[0] in "#;":
                continue
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            if line.startswith("[") and line.endswith("]"):
                section = self.sections.setdefault(line[1:-1], {})
                continue
            assert section is not None, f"assignment outside a section: {line!r}"
            key, sep, value = line.partition("=")
            assert sep, f"not Key=Value: {line!r}"
            values = section.setdefault(key.strip(), [])
            if value.strip():
                values.append(value.strip())
            else:
                values.clear()

    def values(self, key: str, section: str = "Service") -> list[str]:
        return self.sections.get(section, {}).get(key, [])

    def value(self, key: str, section: str = "Service") -> str:
        values = self.values(key, section)
        assert values, f"{section}.{key} is not set"
        return values[-1]

    def argv(self, key: str) -> list[str]:
        """An Exec*= line as argv, its prefixes (-, @, +, !, :) dropped."""
        return shlex.split(self.value(key).lstrip("-@+!:"))

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in self.values("Environment"):
            for assignment in shlex.split(line):
                name, _, value = assignment.partition("=")
                env[name] = value
        return env


TIMESPAN_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "": 1.0, "s": 1.0, "sec": 1.0,
                  "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}


def seconds(span: str) -> float:
    """A systemd time span ("30s", "1min 30s", "500ms", "90") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and all(unit in TIMESPAN_UNITS for _, unit in parts), f"not a time span: {span!r}"
    return sum(float(number) * TIMESPAN_UNITS[unit] for number, unit in parts)


def option(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def unit() -> Unit:
    return Unit(UNIT.read_text())


def test_unit_parser_follows_systemd_rules() -> None:
    parsed = Unit("[Service]\n# comment\n; comment\nA=1\nA=2\nB=x\nB=\nB=y\nC=one\\\n  two\n")
    assert parsed.values("A") == ["1", "2"] and parsed.values("B") == ["y"] and parsed.value("C") == "one two"
    assert seconds("30s") == 30 and seconds("1min 30s") == 90 and seconds("500ms") == 0.5 and seconds("90") == 90


def test_the_unit_waits_for_ready_and_watches_the_loop(unit: Unit) -> None:
    assert unit.value("Type") == "notify"
    assert unit.value("NotifyAccess") == "main", "tool servers must not be able to speak for the daemon"
    watchdog = seconds(unit.value("WatchdogSec"))
    # The daemon pings at half of it; a pause of a second or two (GC, a slow disk) must not look like a hang.
    assert watchdog >= 10, watchdog
    assert unit.value("Restart") == "on-failure"


def test_the_unit_stops_the_way_the_daemon_drains(unit: Unit) -> None:
    assert unit.value("KillMode") == "mixed", "SIGTERM to the daemon only; SIGKILL to whatever is left"
    grace = Settings.model_fields["shutdown_grace"].default
    escalation = STDIN_CLOSE_GRACE + SIGTERM_GRACE + SIGKILL_GRACE
    assert seconds(unit.value("TimeoutStopSec")) > grace + escalation


def test_the_unit_reloads_through_gatewayctl(unit: Unit) -> None:
    start, reload = unit.argv("ExecStart"), unit.argv("ExecReload")
    assert Path(start[0]).name == "gatewayd" and Path(reload[0]).name == "gatewayctl"
    assert Path(start[0]).parent == Path(reload[0]).parent, "both from the same installation"
    assert reload[-1] == "reload"
    config_dir = option(start, "--config-dir")
    assert option(reload, "--config-dir") == config_dir
    assert config_dir == f"/etc/{unit.value('ConfigurationDirectory')}"


def test_the_unit_environment_names_real_settings_in_its_own_directories(
    unit: Unit, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = unit.environment()
    for name in env:
        if name.startswith("GATEWAYD_"):
            assert name.removeprefix("GATEWAYD_").lower() in Settings.model_fields, f"{name} is no setting"
    # The shipped tools.d files run `python3 -m gatewayd.examples…`: the installation's python3 must come first.
    assert env["PATH"].split(":")[0] == str(Path(unit.argv("ExecStart")[0]).parent)
    monkeypatch.setenv("GATEWAYD_SETTINGS_FILE", str(tmp_path / "absent.toml"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(config_dir=Path(option(unit.argv("ExecStart"), "--config-dir")))
    admin_socket, audit = settings.admin_socket_path(), settings.audit_file()
    assert admin_socket is not None and audit is not None
    # Absolute paths win over the config directory, which the sandbox keeps read-only.
    assert admin_socket.parent == Path("/run") / unit.value("RuntimeDirectory")
    assert audit.parent == Path("/var/log") / unit.value("LogsDirectory")
    assert unit.value("WorkingDirectory") == f"/var/lib/{unit.value('StateDirectory')}"


def test_the_unit_runs_unprivileged(unit: Unit) -> None:
    assert unit.value("User") not in ("root", "0")
    assert unit.values("CapabilityBoundingSet") == [] and "CapabilityBoundingSet" in unit.sections["Service"]
    assert unit.values("AmbientCapabilities") == []
    assert unit.value("NoNewPrivileges") == "yes"
    assert unit.value("ProtectSystem") == "strict"
    assert unit.value("IPAddressDeny") == "any" and unit.value("IPAddressAllow") == "localhost"



def installed(argv: list[str], config_dir: Path) -> list[str]:
    """An Exec*= command line pointed at this checkout's installation and `config_dir` instead of /opt and /etc."""
    bin_dir = Path(sys.executable).parent
    program = bin_dir / Path(argv[0]).name
    if not program.exists():
        pytest.skip(f"no {program.name} in {bin_dir} to stand in for the installed one")
    args = argv[1:]
    args[args.index("--config-dir") + 1] = str(config_dir)
    return [str(program), *args]


async def test_exec_reload_succeeds_and_fails_visibly_on_a_bad_config(unit: Unit, config_dir: Path) -> None:
    """What `systemctl reload` runs, against the real daemon: exit 0, then non-zero once a file is broken."""

    async def exec_reload() -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *installed(unit.argv("ExecReload"), config_dir), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=daemon_env(), cwd=str(config_dir))
        async with asyncio.timeout(GATEWAYCTL_DEADLINE):
            out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, (out + err).decode()

    async with Daemon(config_dir, env=no_watchdog()):
        code, output = await exec_reload()
        assert code == 0, output
        (config_dir / "tools.d" / "calc.toml").write_text(CALC + "call_timout = '5s'\n")
        code, output = await exec_reload()
        assert code != 0 and "call_timout" in output, output

# -- e. systemd-analyze --------------------------------------------------------------------------


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if not SYSTEMD_ANALYZE.exists():
        pytest.skip(f"{SYSTEMD_ANALYZE} is not installed, so the unit cannot be analysed here")
    return subprocess.run([str(SYSTEMD_ANALYZE), *args], capture_output=True, text=True, timeout=ANALYZE_DEADLINE,
                          check=False, env={**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""})


def test_security_exposure_is_low() -> None:
    result = analyze("security", "--offline=yes", str(UNIT))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    """`verify` also checks that ExecStart= exists: point it at this checkout's installation instead of /opt."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "gatewayd").exists() or not (bin_dir / "gatewayctl").exists():
        pytest.skip(f"no gatewayd/gatewayctl in {bin_dir} to stand in for the installed ones")
    unit_dir = Unit(UNIT.read_text()).argv("ExecStart")[0].rsplit("/", 1)[0]
    local = tmp_path / UNIT.name
    local.write_text(UNIT.read_text().replace(unit_dir + "/", f"{bin_dir}/"))
    result = analyze("verify", str(local))
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


# -- f. gatewayd.systemd on its own ----------------------------------------------------------------


def test_notify_without_a_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert systemd.notify("READY=1") is False


def test_notify_sends_one_datagram_of_lines(notify_path: NotifySocket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path.address)
    assert systemd.notify("READY=1", "STATUS=serving x") is True
    assert notify_path.drain() == [{"READY": "1", "STATUS": "serving x"}]


def test_notify_reaches_an_abstract_socket(notify_abstract: NotifySocket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_abstract.address)
    assert systemd.notify("STOPPING=1") is True
    assert notify_abstract.drain() == [{"STOPPING": "1"}]


def test_notify_to_a_missing_socket_returns_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert systemd.notify("READY=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("", None, None),
        ("200000", None, 0.1),
        ("200000", "self", 0.1),
        ("200000", "other", None),
        ("30000000", "", 15.0),
        ("soon", None, None),
    ],
)
def test_watchdog_interval(
    usec: str | None, pid: str | None, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, {"self": str(os.getpid()), "other": str(os.getppid())}.get(value, value))
    assert systemd.watchdog_interval() == expected


def test_monotonic_usec_is_clock_monotonic_in_microseconds() -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    field = systemd.monotonic_usec()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    match = re.fullmatch(r"MONOTONIC_USEC=(\d+)", field)
    assert match, field
    assert before <= int(match.group(1)) <= after


async def test_the_watchdog_coroutine_pings_until_cancelled(
    notify_path: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path.address)
    pinger = asyncio.create_task(systemd.watchdog(0.01))
    try:
        async with asyncio.timeout(NOTIFY_DEADLINE):
            while notify_path.count("WATCHDOG") < WATCHDOG_PINGS:
                await notify_path.next()
    finally:
        pinger.cancel()
        await asyncio.gather(pinger, return_exceptions=True)
    assert all(message == {"WATCHDOG": "1"} for message in notify_path.messages)
