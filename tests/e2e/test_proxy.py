"""The real daemon behind a real TLS reverse proxy, Debian's nginx and Caddy, each running the config shipped in
deploy/ (templated only in ports, certificate paths and the daemon's address), as shipped and with its lines for a path
prefix in use instead (`https://gw.example.org:PORT/gw/mcp`).

Through the proxy, at `https://gw.example.org:PORT` (the name resolved to 127.0.0.1 by the clients themselves,
the certificate a throwaway self-signed one): the official MCP SDK gets SSE progress while its call runs (the
first event arrives before the tool is told to finish, so nothing is buffered until the end), and a call that
needs approval is announced with the public approval page, which is served through the proxy, and approving
through its API with the https Origin lets the call run. The cases issue 17 item 6 found broken: the proxy's
https Origin (was 403), local clients beside the public name (were 421); and what must stay refused: a foreign
Origin, a foreign Host, paths the configs do not publish.

Needs /usr/sbin/nginx (apt-get install nginx) and /usr/bin/caddy (apt-get install caddy); without one its tests
are skipped, unless GATEWAYD_REQUIRE_PROXIES=1 (CI), which makes a missing proxy a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from aiohttp.abc import AbstractResolver, ResolveResult
from mcp import Client
from mcp.client.session import IncomingMessage, MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client
from mcp_types import LoggingMessageNotification

from gatewayd.config.edit import set_client_token, set_operator_token
from gatewayd.tokens import hash_token, new_token
from tests.daemon import REPO, Daemon, gatewayctl, python_command
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, TEST_DEADLINE, bearer, text_of
from tests.e2e.test_systemd import NotifySocket, no_watchdog

pytestmark = pytest.mark.asyncio(loop_scope="module")

NGINX: Final = Path("/usr/sbin/nginx")
CADDY: Final = Path("/usr/bin/caddy")
NGINX_CONF: Final = REPO / "deploy" / "nginx" / "gatewayd.conf"
CADDYFILE: Final = REPO / "deploy" / "caddy" / "Caddyfile"
HOLDSRV: Final = REPO / "tests" / "fixtures" / "holdsrv.py"
# The name the shipped configs serve; the clients here resolve it to loopback themselves.
NAME: Final = "gw.example.org"
# Time for a proxy to start listening, and to stop after SIGTERM; generous for a loaded 2-core machine.
PROXY_START_DEADLINE: Final = 20.0
PROXY_STOP_DEADLINE: Final = 10.0
# The shipped Caddyfile's grace period for streams still open when Caddy stops, shortened: the tests stop it often.
CADDY_GRACE_S: Final = 1
# Time for openssl to make the throwaway certificate.
OPENSSL_DEADLINE: Final = 30.0
# How often the proxy's port is tried while it starts.
CONNECT_POLL_S: Final = 0.05
# The path prefix the shipped configs' commented lines publish the daemon under.
PREFIX: Final = "/gw"
ROLES: Final = """
[roles.agent]
allow = ["hold.hold", "hold.release"]
confirm = ["hold.echo"]

[roles.agent.confirmation."hold.echo"]
timeout = "30s"
channels = ["web"]
"""


# -- the proxies -------------------------------------------------------------------------------


def require(binary: Path, package: str) -> None:
    """Skip without the proxy, or fail when CI requires the proxy tests."""
    if not binary.exists():
        reason = f"{binary} is missing (apt-get install {package})"
        if os.environ.get("GATEWAYD_REQUIRE_PROXIES") == "1":
            pytest.fail(f"{reason}, and GATEWAYD_REQUIRE_PROXIES=1")
        pytest.skip(reason)


def templated(text: str, replacements: list[tuple[str, str]]) -> str:
    """The shipped config with each `(old, new)` replaced; an `old` that is not there fails the test, so a changed
    config cannot silently be tested in some other shape."""
    for old, new in replacements:
        assert old in text, f"{old!r} is no longer in the shipped config"
        text = text.replace(old, new)
    return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Certificate:
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        """A client context trusting only this certificate, checking the name as any client would."""
        return ssl.create_default_context(cafile=str(self.cert))


async def run(*argv: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command to its end; its output (stderr merged). Fails the test on a non-zero exit."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env=env)
    async with asyncio.timeout(timeout):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, (argv, out.decode(errors="replace"))
    return out.decode(errors="replace")


async def make_certificate(directory: Path) -> Certificate:
    """A throwaway self-signed certificate for NAME (openssl; the tests have no `cryptography`)."""
    cert = Certificate(directory / "cert.pem", directory / "key.pem")
    await run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
              "-days", "1", "-subj", f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}",
              "-keyout", str(cert.key), "-out", str(cert.cert), timeout=OPENSSL_DEADLINE)
    return cert


@dataclass
class Ports:
    https: int = field(default_factory=free_port)
    http: int = field(default_factory=free_port)
    admin: int = field(default_factory=free_port)


NGINX_ROOT_LOCATIONS: Final = "".join(f"    location {match} {{\n        proxy_pass http://127.0.0.1:8765;\n    }}\n"
                                     for match in ("= /mcp", "= /approvals", "/approvals/api/"))
NGINX_PREFIXED: Final = [(f"    # location {match} {{\n    #     proxy_pass http://127.0.0.1:8765{path};\n    # }}\n",
                          f"    location {match} {{\n        proxy_pass http://127.0.0.1:8765{path};\n    }}\n")
                         for match, path in (("= /gw/mcp", "/mcp"), ("= /gw/approvals", "/approvals"),
                                             ("/gw/approvals/api/", "/approvals/api/"))]


def nginx_config(directory: Path, ports: Ports, cert: Certificate, daemon: str, prefix: str) -> list[str]:
    """Write the shipped site file, templated (with its prefix's locations in place of the root's when `prefix`),
    inside a minimal main config; the nginx command line."""
    under_prefix = [(NGINX_ROOT_LOCATIONS, ""), *NGINX_PREFIXED] if prefix else []
    site = templated(NGINX_CONF.read_text(), [
        *under_prefix,
        ("listen 80;", f"listen 127.0.0.1:{ports.http};"),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{ports.https} ssl http2;"),
        (f"/etc/letsencrypt/live/{NAME}/fullchain.pem", str(cert.cert)),
        (f"/etc/letsencrypt/live/{NAME}/privkey.pem", str(cert.key)),
        ("http://127.0.0.1:8765", daemon),
    ])
    (directory / "site.conf").write_text(site)
    temp = "\n".join(f"  {kind}_temp_path {directory / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                               "uwsgi", "scgi"))
    # As root, nginx's workers would run as `nobody` and could not use the private temporary directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    (directory / "nginx.conf").write_text(
        f"daemon off;\n{user}pid {directory / 'nginx.pid'};\nerror_log {directory / 'error.log'} info;\n"
        f"events {{ worker_connections 256; }}\n"
        f"http {{\n  access_log {directory / 'access.log'};\n{temp}\n  include {directory / 'site.conf'};\n}}\n"
    )
    return [str(NGINX), "-p", str(directory), "-c", str(directory / "nginx.conf"), "-e", str(directory / "error.log")]


CADDY_PREFIXED: Final = [("\t@gatewayd path /mcp /approvals /approvals/api/*\n", ""),
                         ("\t# @gatewayd path /gw/", "\t@gatewayd path /gw/"),
                         ("\t\t# uri strip_prefix /gw", "\t\turi strip_prefix /gw")]


def caddy_config(directory: Path, ports: Ports, cert: Certificate, daemon: str, prefix: str) -> list[str]:
    """Write the shipped Caddyfile, templated (its prefix's matcher and stripping in use when `prefix`); the caddy
    command line."""
    caddyfile = templated(CADDYFILE.read_text(), [
        *(CADDY_PREFIXED if prefix else []),
        ("http_port 80", f"http_port {ports.http}"),
        ("https_port 443", f"https_port {ports.https}"),
        # Servers started by tests listen on loopback only; the shipped file binds all addresses, as a proxy must.
        ("admin localhost:2019", f"admin localhost:{ports.admin}\n\tdefault_bind 127.0.0.1"),
        ("grace_period 10s", f"grace_period {CADDY_GRACE_S}s"),
        ("# tls /etc/ssl/gatewayd/fullchain.pem /etc/ssl/gatewayd/privkey.pem", f"tls {cert.cert} {cert.key}"),
        ("reverse_proxy 127.0.0.1:8765", f"reverse_proxy {daemon.removeprefix('http://')}"),
    ])
    (directory / "Caddyfile").write_text(caddyfile)
    return [str(CADDY), "run", "--config", str(directory / "Caddyfile"), "--adapter", "caddyfile"]


PROXIES: Final[dict[str, tuple[Path, Callable[[Path, Ports, Certificate, str, str], list[str]]]]] = {
    "nginx": (NGINX, nginx_config),
    "caddy": (CADDY, caddy_config),
}


@contextlib.asynccontextmanager
async def running_proxy(argv: list[str], directory: Path, port: int) -> AsyncIterator[None]:
    """The proxy as a child of this test, listening on `port`; stopped after (SIGTERM, then SIGKILL), and a proxy
    that did not stop by itself within PROXY_STOP_DEADLINE fails: streams still open (the daemon's are long-lived)
    must not hold it, as Caddy's default eternal grace period would."""
    # Caddy keeps its state (certificates, autosave) under these; nothing may land in the real home.
    env = {**os.environ, "HOME": str(directory), "XDG_DATA_HOME": str(directory / "data"),
           "XDG_CONFIG_HOME": str(directory / "config")}
    log = (directory / "proxy.log").open("wb")
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                                                env=env, start_new_session=True)
    try:
        await until_listening(proc, port, directory / "proxy.log")
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        stopped = True
        try:
            async with asyncio.timeout(PROXY_STOP_DEADLINE):
                await proc.wait()
        except TimeoutError:
            stopped = False
            proc.kill()
            await proc.wait()
        log.close()
    assert stopped, f"{argv[0]} did not stop in {PROXY_STOP_DEADLINE}s of SIGTERM: {logged(directory / 'proxy.log')}"


def logged(log: Path) -> str:
    return log.read_text(errors="replace")


async def until_listening(proc: asyncio.subprocess.Process, port: int, log: Path) -> None:
    async with asyncio.timeout(PROXY_START_DEADLINE):
        while True:
            if proc.returncode is not None:
                raise AssertionError(f"the proxy exited ({proc.returncode}):\n{logged(log)}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                await writer.wait_closed()
                return
            await asyncio.sleep(CONNECT_POLL_S)


# -- clients that reach NAME on loopback ----------------------------------------------------------


class LoopbackResolver(AbstractResolver):
    """aiohttp's resolver for these tests: NAME (and only NAME) is 127.0.0.1, as DNS would say in production."""

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        assert host == NAME, host
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


class LoopbackTransport(httpx2.AsyncBaseTransport):
    """The SDK's HTTP transport for these tests: connects to 127.0.0.1 for NAME, with NAME still the TLS server name
    (so the certificate is checked against it) and the Host header."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=context)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.host == NAME, request.url
        request.url = request.url.copy_with(host="127.0.0.1")
        request.extensions = {**request.extensions, "sni_hostname": NAME}
        response: httpx2.Response = await self._inner.handle_async_request(request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Proxied:
    """The daemon behind one proxy: its public URL, local URL, tokens, and how to reach it."""

    proxy: str
    origin: str  # https://gw.example.org:PORT
    public: str  # the origin and the path prefix the proxy publishes the daemon under: what public_url says
    local: str  # http://127.0.0.1:PORT of the daemon itself
    redirect: str  # http://127.0.0.1:PORT of the proxy's plain-HTTP side
    agent: str
    operator: str
    cert: Certificate

    @contextlib.asynccontextmanager
    async def http(self) -> AsyncIterator[aiohttp.ClientSession]:
        connector = aiohttp.TCPConnector(resolver=LoopbackResolver(), ssl=self.cert.context())
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=TEST_DEADLINE)) as session:
            yield session

    @contextlib.asynccontextmanager
    async def sdk(self, on_message: MessageHandlerFnT | None = None) -> AsyncIterator[Client]:
        async with httpx2.AsyncClient(
            headers={"Authorization": bearer(self.agent)}, transport=LoopbackTransport(self.cert.context()),
            timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT),
        ) as http:
            async with Client(streamable_http_client(self.public + "/mcp", http_client=http), mode="legacy",
                              read_timeout_seconds=SDK_READ_TIMEOUT, message_handler=on_message) as client:
                yield client


@pytest_asyncio.fixture(loop_scope="module", scope="module",
                        params=[(proxy, prefix) for proxy in PROXIES for prefix in ("", PREFIX)],
                        ids=lambda param: param[0] + ("-under-a-prefix" if param[1] else ""))
async def proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Proxied]:
    proxy, prefix = request.param
    binary, configure = PROXIES[proxy]
    require(binary, proxy)
    root = tmp_path_factory.mktemp(f"behind-{proxy}")
    config, proxy_dir = root / "config", root / "proxy"
    (config / "tools.d").mkdir(parents=True)
    (config / "policies").mkdir()
    proxy_dir.mkdir()
    (config / "tools.d" / "hold.toml").write_text(python_command(str(HOLDSRV)) + "\n")
    (config / "policies" / "roles.toml").write_text(ROLES)
    agent, operator = new_token(), new_token()
    set_client_token(config / "policies" / "clients.toml", "agent", hash_token(agent), ["agent"])
    set_operator_token(config / "policies" / "operators.toml", "ops", hash_token(operator))
    cert = await make_certificate(proxy_dir)
    ports = Ports()
    origin = f"https://{NAME}:{ports.https}"
    async with Daemon(config, "--public-url", origin + prefix) as daemon:
        local = daemon.url.removesuffix("/mcp")
        argv = configure(proxy_dir, ports, cert, local, prefix)
        async with running_proxy(argv, proxy_dir, ports.https):
            yield Proxied(proxy, origin, origin + prefix, local, f"http://127.0.0.1:{ports.http}", agent, operator,
                          cert)


# -- through the proxy ---------------------------------------------------------------------------------


async def test_sse_progress_arrives_through_the_proxy_while_the_call_runs(proxied: Proxied) -> None:
    """holdsrv's `hold` reports step 1, then waits for `release`: the test calls `release` only once step 1 reached
    the SDK, so a proxy that held the stream back until the call ended would leave this waiting (and fail)."""
    steps: list[float] = []
    first, second = asyncio.Event(), asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)
        (first if len(steps) == 1 else second).set()

    async with asyncio.timeout(TEST_DEADLINE), proxied.sdk() as client, proxied.http() as http:
        call = asyncio.create_task(client.call_tool("hold__hold", {}, progress_callback=on_progress))
        await first.wait()
        assert not call.done() and steps == [1]
        async with http.post(proxied.public + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "hold.release"},
                             headers={"Authorization": bearer(proxied.agent)}) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["result"]["content"][0]["text"] == "ok"
        result = await call
        await second.wait()
    assert text_of(result) == "released" and steps == [1, 2]


@dataclass
class Notices:
    """The gateway's `gatewayd.approvals` notices to the SDK client."""

    received: list[dict[str, Any]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, LoggingMessageNotification) and message.params.logger == "gatewayd.approvals":
            assert isinstance(message.params.data, dict)
            self.received.append(message.params.data)
            self.arrived.set()


async def test_an_approval_through_the_proxy_names_the_public_page_and_is_answered_there(proxied: Proxied) -> None:
    notices = Notices()
    origin = {"Origin": proxied.origin, "Authorization": bearer(proxied.operator)}
    async with asyncio.timeout(TEST_DEADLINE), proxied.sdk(notices) as client, proxied.http() as http:
        call = asyncio.create_task(client.call_tool("hold__echo", {"through": proxied.proxy}))
        await notices.arrived.wait()
        [notice] = notices.received
        assert notice["event"] == "approval_pending"
        assert notice["approval_page"] == f"{proxied.public}/approvals"
        # The page, as a person's browser would load it from the notice.
        async with http.get(notice["approval_page"]) as page:
            assert page.status == 200 and page.content_type == "text/html"
            assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
            # Its API links are relative to the page itself, so they lead under the prefix too.
            assert 'const API = "approvals/api";' in await page.text()
        async with http.get(f"{proxied.public}/approvals/api/pending", headers=origin) as pending:
            assert pending.status == 200, await pending.text()
            [waiting] = (await pending.json())["approvals"]
        assert waiting["id"] == notice["approval_id"] and waiting["arguments"] == {"through": proxied.proxy}
        async with http.post(f"{proxied.public}/approvals/api/{waiting['id']}/approve", headers=origin) as answer:
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["ok"] is True
        result = await call
    assert json.loads(text_of(result)) == {"through": proxied.proxy}


async def test_the_live_approval_stream_reaches_the_page_through_the_proxy(proxied: Proxied) -> None:
    """The page's SSE stream (`snapshot` first) is not held back by the proxy either."""
    headers = {"Origin": proxied.origin, "Authorization": bearer(proxied.operator)}
    async with asyncio.timeout(TEST_DEADLINE), proxied.http() as http:
        async with http.get(f"{proxied.public}/approvals/api/stream", headers=headers) as stream:
            assert stream.status == 200 and stream.content_type == "text/event-stream"
            assert await stream.content.readline() == b"event: snapshot\n"


async def mcp_status(http: aiohttp.ClientSession, url: str, token: str, **headers: str) -> int:
    message = {"jsonrpc": "2.0", "id": 1, "method": "hold.release"}
    async with http.post(url, json=message, headers={"Authorization": bearer(token), **headers}) as response:
        await response.read()
        return response.status


async def test_the_proxys_https_origin_is_served_and_a_foreign_one_is_not(proxied: Proxied) -> None:
    """Issue 17 item 6: `Origin: https://gw.example.org` through the proxy was 403."""
    async with asyncio.timeout(TEST_DEADLINE), proxied.http() as http:
        url = proxied.public + "/mcp"
        assert await mcp_status(http, url, proxied.agent, Origin=proxied.origin) == 200
        assert await mcp_status(http, url, proxied.agent, Origin=proxied.origin.replace("https:", "http:")) == 403
        assert await mcp_status(http, url, proxied.agent, Origin="https://evil.example.com") == 403


async def test_local_clients_keep_working_beside_the_public_name(proxied: Proxied) -> None:
    """Issue 17 item 6: with the proxy's name configured, local clients got 421."""
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http:
        assert await mcp_status(http, proxied.local + "/mcp", proxied.agent) == 200
        assert await mcp_status(http, proxied.local + "/mcp", proxied.agent, Origin=proxied.local) == 200
        # The public name is the proxy's, reaching the daemon directly under it is served too (it is its name).
        assert await mcp_status(http, proxied.local + "/mcp", proxied.agent, Host=NAME) == 200
        assert await mcp_status(http, proxied.local + "/mcp", proxied.agent, Host="rebound.example.net") == 421


async def test_a_foreign_host_through_the_proxy_never_reaches_a_tool(proxied: Proxied) -> None:
    """A page under another name that resolves to the proxy (DNS rebinding) gets no answer from the daemon."""
    message = {"jsonrpc": "2.0", "id": 1, "method": "hold.release"}
    headers = {"Authorization": bearer(proxied.agent), "Host": "rebound.example.net"}
    async with asyncio.timeout(TEST_DEADLINE), proxied.http() as http:
        async with http.post(proxied.public + "/mcp", json=message, headers=headers) as response:
            status, body = response.status, await response.read()
    if proxied.proxy == "nginx":
        # nginx's one server block passes any Host on: the daemon refuses it.
        assert status == 421, body
    else:
        # Caddy routes only its site's name: nothing is forwarded, and its answer to no route is an empty 200.
        assert (status, body) == (200, b"")


async def test_only_the_endpoint_and_the_approval_page_are_published(proxied: Proxied) -> None:
    async with asyncio.timeout(TEST_DEADLINE), proxied.http() as http:
        for path in ("/metrics", "/healthz", "/", "/mcp/x", "/approvalsx"):
            async with http.get(proxied.public + path) as response:
                assert response.status == 404, path
        if proxied.public != proxied.origin:
            # Under a prefix, nothing is published at the root.
            for path in ("/mcp", "/approvals", "/approvals/api/pending"):
                async with http.get(proxied.origin + path) as response:
                    assert response.status == 404, path
        async with http.post(proxied.public + "/mcp", json={}) as response:
            assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_plain_http_redirects_to_https(proxied: Proxied) -> None:
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http:
        page = proxied.public.removeprefix(proxied.origin) + "/approvals"
        async with http.get(proxied.redirect + page, headers={"Host": NAME}, allow_redirects=False) as response:
            assert response.status in (301, 308)
            assert response.headers["Location"].startswith(f"https://{NAME}")
            assert response.headers["Location"].endswith(page)


async def test_a_bad_public_url_stops_the_daemon_before_it_listens(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gatewayd", "--config-dir", str(tmp_path), "--public-url", f"https://{NAME}/gate way",
        "--check", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(TEST_DEADLINE):
        _, err = await proc.communicate()
    assert proc.returncode == 64
    assert "setting public_url" in err.decode() and "its path must be empty, /mcp, or the prefix" in err.decode()


# -- the other places that hand out links -------------------------------------------------------------


def public_config(root: Path) -> Path:
    """A config directory whose gatewayd.toml names the public URL."""
    (root / "tools.d").mkdir(parents=True)
    (root / "policies").mkdir()
    (root / "tools.d" / "hold.toml").write_text(python_command(str(HOLDSRV)) + "\n")
    (root / "policies" / "roles.toml").write_text('[roles.developer]\nallow = ["hold.*"]\n')
    (root / "gatewayd.toml").write_text(f'public_url = "https://{NAME}/mcp"\n')
    return root


async def test_the_systemd_status_line_names_the_public_url_beside_the_listening_one(tmp_path: Path) -> None:
    config = public_config(tmp_path / "config")
    listener = NotifySocket(str(tmp_path / "notify"))
    try:
        async with Daemon(config, env={"NOTIFY_SOCKET": listener.address, **no_watchdog()}) as daemon:
            ready = await listener.until("READY")
            assert ready["STATUS"].startswith(f"serving {daemon.url} (public https://{NAME}/mcp): "), ready
            await daemon.wait_log(rf"listening on {daemon.url} \(public https://{NAME}/mcp\)")
    finally:
        listener.close()


async def test_dev_client_prints_the_public_endpoint_and_page(tmp_path: Path) -> None:
    config = public_config(tmp_path)
    code, out, err = await gatewayctl(config, "dev-client", "--url", "http://127.0.0.1:8765/mcp")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"endpoint:  https://{NAME}/mcp   (through the proxy; the daemon listens on " \
                       "http://127.0.0.1:8765/mcp)"
    assert f"curl -s https://{NAME}/mcp " in out and "127.0.0.1:8765/approvals" not in out
    assert f"or https://{NAME}/approvals with the operator token" in out
    (config / "gatewayd.toml").write_text('public_url = "ftp://gw.example.org"\n')
    code, out, err = await gatewayctl(config, "dev-client")
    assert code == 2 and out == "" and "setting public_url" in err and "must start with https://" in err
