"""Request limits over real loopback sockets: each setting is crossed, and the daemon keeps serving others.

Slow clients are raw `asyncio` connections that pause between bytes (the pause is the input); every
assertion waits on an event (an answer, the server closing) under a deadline, never on a sleep.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from gatewayd.config.models import ClientLimits
from gatewayd.errors import HttpError
from gatewayd.policy import Principal
from gatewayd.state import DaemonState
from gatewayd.web.limits import EVICTION_GRACE, ClientLimiter, _Quota
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import eventually

CALC = python_command("-m", "gatewayd.examples.calc") + """
protocol = "jsonrpc"
[methods.add]
"""
FAULT = python_command(str(FAULTSRV), "--mcp")
ROLES = """
[roles.all]
allow = ["calc.*", "fault.*"]
"""
# Bound on every wait for the server to answer or close; generous for a loaded 2-core machine.
DEADLINE = 5.0
# How long a slow client waits between two bytes.
TRICKLE_PAUSE = 0.05


class Stack:
    """An in-process gateway; clients `alice`, `bob` (daemon defaults) and `tight` (policy overrides)."""

    def __init__(self, client: LocalClient, state: DaemonState, tokens: dict[str, str]) -> None:
        self.client = client
        self.state = state
        self.tokens = tokens
        self.host = f"127.0.0.1:{client.port}"

    def headers(self, who: str = "alice", **extra: str) -> dict[str, str]:
        return headers(self.tokens[who], **extra)

    async def post(self, body: Any, who: str = "alice", **extra: str) -> tuple[int, Any, dict[str, str]]:
        response = await self.client.post("/mcp", data=json.dumps(body), headers=self.headers(who, **extra))
        text = await response.text()
        payload = json.loads(text) if response.content_type == "application/json" and text else text
        return response.status, payload, dict(response.headers)

    async def add(self, who: str = "alice") -> None:
        """A well-behaved call; it must succeed."""
        status, body, _ = await self.post(call("calc.add", {"a": 2, "b": 3}), who)
        assert (status, body["result"]) == (200, 5)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.client.port)

    def request_head(self, method: str, path: str, **headers: str) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def call_on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, who: str = "alice") -> int:
        """One JSON-RPC call with `who`'s token on a raw connection (which it authenticates); the HTTP status."""
        body = json.dumps(call("nosuch.method")).encode()
        writer.write(self.request_head("POST", "/mcp", **self.headers(who), **{"Content-Length": str(len(body))})
                     + body)
        status, _ = await read_response(reader)
        return status


def stack_fixture(**settings: Any) -> Any:
    """A fixture running the stack with these settings."""

    @pytest.fixture
    async def fixture(tmp_path: Path) -> AsyncIterator[Stack]:
        tokens = write_config(tmp_path, {"calc": CALC, "fault": FAULT}, ROLES,
                              {"alice": ["all"], "bob": ["all"], "tight": ["all"]})
        set_limits(tmp_path / "policies" / "clients.toml", "tight", max_concurrent=1, rate=0.01, burst=2)
        async with running_stack(tmp_path, **settings) as (client, state):
            yield Stack(client, state, tokens)

    return fixture


def set_limits(path: Path, client: str, **limits: Any) -> None:
    data = tomllib.loads(path.read_text())
    data["clients"][client]["limits"] = limits
    path.write_text(tomli_w.dumps(data))


def call(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, **({"params": params} if params is not None else {})}


async def trickle_until_answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """Send one byte per pause until the server says something or closes; return all it sent."""
    while True:
        writer.write(b"a")
        try:
            async with asyncio.timeout(TRICKLE_PAUSE):
                first = await reader.read(65536)
        except TimeoutError:
            continue
        return first + await read_until_closed(reader)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (a reset after its answer counts as closed)."""
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionError:
        pass
    return data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


# -- header and whole-request deadlines ------------------------------------------------------------

slow = stack_fixture(header_timeout=0.4, request_timeout=0.8)


async def test_trickled_headers_get_408_and_close_while_others_are_served(slow: Stack) -> None:
    loop = asyncio.get_running_loop()
    # Read before connecting: the server's clock starts when it accepts, which may come first.
    opened = loop.time()
    reader, writer = await slow.connect()
    writer.write(slow.request_head("POST", "/mcp").removesuffix(b"\r\n\r\n") + b"\r\nX-Slow: ")
    slow_client = asyncio.ensure_future(trickle_until_answered(reader, writer))
    await asyncio.gather(slow.add(), slow.add("bob"))
    async with asyncio.timeout(DEADLINE):
        answer = await slow_client
    writer.close()
    # The header deadline cut it (not the later whole-request one), and not before it was due.
    assert status_of(answer) == 408 and answer.endswith(b"request headers not received in time\n")
    assert b"Connection: close" in answer and loop.time() - opened >= 0.4
    await slow.add()


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer(slow: Stack) -> None:
    reader, writer = await slow.connect()
    async with asyncio.timeout(DEADLINE):
        assert await read_until_closed(reader) == b""
    writer.close()


async def test_trickled_body_gets_408_and_close_while_others_are_served(slow: Stack) -> None:
    reader, writer = await slow.connect()
    writer.write(slow.request_head("POST", "/mcp", **slow.headers(), **{"Content-Length": "1000"}))
    slow_client = asyncio.ensure_future(trickle_until_answered(reader, writer))
    await slow.add("bob")
    async with asyncio.timeout(DEADLINE):
        answer = await slow_client
    writer.close()
    assert status_of(answer) == 408 and answer.endswith(b"request body not received in time\n")
    await slow.add()


async def test_an_idle_kept_alive_connection_is_not_cut_by_the_header_deadline(slow: Stack) -> None:
    reader, writer = await slow.connect()
    async with asyncio.timeout(DEADLINE):
        writer.write(slow.request_head("GET", "/healthz"))
        assert await read_response(reader) == (200, b"ok\n")
    # Idle for longer than both deadlines: that is the keep-alive timeout's business, not theirs.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0):
            await reader.read(1)
    async with asyncio.timeout(DEADLINE):
        writer.write(slow.request_head("GET", "/healthz"))
        assert await read_response(reader) == (200, b"ok\n")
    writer.close()


short_keepalive = stack_fixture(keepalive_timeout=0.3)


async def test_an_idle_kept_alive_connection_closes_after_the_keepalive_timeout(short_keepalive: Stack) -> None:
    reader, writer = await short_keepalive.connect()
    async with asyncio.timeout(DEADLINE):
        writer.write(short_keepalive.request_head("GET", "/healthz"))
        assert await read_response(reader) == (200, b"ok\n")
        assert await read_until_closed(reader) == b""
    writer.close()


# -- total connections -------------------------------------------------------------------------------

few_connections = stack_fixture(max_connections=2)


async def test_connections_past_the_cap_get_503_while_open_ones_carry_on(few_connections: Stack) -> None:
    stack = few_connections
    first, second = await stack.connect(), await stack.connect()
    async with asyncio.timeout(DEADLINE):
        # Both present a token: nobody may close them to make room (an unauthenticated one would be).
        assert await stack.call_on(*first) == 200
        assert await stack.call_on(*second, who="bob") == 200
        first[1].write(stack.request_head("GET", "/healthz"))
        assert await read_response(first[0]) == (200, b"ok\n")
        # Idle long enough that an unauthenticated connection would be closed to make room for the third.
        answered = asyncio.get_running_loop().time()
        await eventually(lambda: asyncio.get_running_loop().time() > answered + EVICTION_GRACE, DEADLINE)
        third = await stack.connect()
        refused = await read_until_closed(third[0])
        assert status_of(refused) == 503 and b"Retry-After: 1" in refused
        second[1].write(stack.request_head("GET", "/healthz"))
        assert await read_response(second[0]) == (200, b"ok\n")
        third[1].close()
        # Closing ends with the server's own close: it has counted them out before the client sees the end.
        for reader, writer in (first, second):
            writer.write(stack.request_head("GET", "/healthz", Connection="close"))
            assert status_of(await read_until_closed(reader)) == 200
            writer.close()
        assert await admitted(stack)


async def admitted(stack: Stack) -> bool:
    """Whether a new connection is served (a refused one may also be reset, having sent its request)."""
    reader, writer = await stack.connect()
    writer.write(stack.request_head("GET", "/healthz"))
    try:
        return status_of(await reader.readuntil(b"\r\n")) == 200
    except (ConnectionError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()


# -- header sizes ----------------------------------------------------------------------------------

small_headers = stack_fixture(max_line_bytes=512, max_header_bytes=512, max_headers=10)


@pytest.mark.parametrize("what", ["line", "field", "count"])
async def test_header_size_limits_give_400(small_headers: Stack, what: str, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    stack = small_headers
    path, headers = "/healthz", {}
    if what == "line":
        path += "?pad=" + "x" * 600
    elif what == "field":
        headers["X-Pad"] = "x" * 600
    else:
        headers.update({f"X-Pad-{i}": "x" for i in range(20)})
    response = await stack.client.get(path, headers=headers)
    assert response.status == 400
    response = await stack.client.get("/healthz")
    assert response.status == 200
    # The client's mistake is not the daemon's error: no traceback per bad request.
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


# -- per-client rate and concurrency -----------------------------------------------------------------

slow_rate = stack_fixture(client_rate=0.01, client_burst=3)


async def test_messages_over_the_rate_get_429_with_retry_after(slow_rate: Stack) -> None:
    stack = slow_rate
    for _ in range(3):
        status, body, _ = await stack.post(call("nosuch.method"))
        assert status == 200 and body["error"]["code"] == -32601
    status, text, headers = await stack.post(call("nosuch.method"))
    assert status == 429 and text.startswith("rate limit")
    # One token at 0.01/s: 100 s.
    assert headers["Retry-After"] == "100"
    # Per client: bob still has his burst, and a batch costs one token per message.
    status, _, _ = await stack.post([call("nosuch.method", id=1), call("nosuch.method", id=2)], who="bob")
    assert status == 200
    status, _, headers = await stack.post([call("nosuch.method", id=1), call("nosuch.method", id=2)], who="bob")
    assert status == 429 and int(headers["Retry-After"]) >= 1


defaults = stack_fixture()


async def test_policy_limits_override_the_daemon_defaults(defaults: Stack) -> None:
    # `tight` may send 2 messages at once and 0.01 a second; alice has the daemon's 100 and 50.
    for _ in range(2):
        assert (await defaults.post(call("nosuch.method"), who="tight"))[0] == 200
    status, _, headers = await defaults.post(call("nosuch.method"), who="tight")
    assert status == 429 and headers["Retry-After"] == "100"
    for _ in range(5):
        assert (await defaults.post(call("nosuch.method")))[0] == 200


one_at_a_time = stack_fixture(client_max_concurrent=1)


async def test_concurrent_requests_over_the_limit_get_429_and_cancel_still_gets_through(one_at_a_time: Stack) -> None:
    stack = one_at_a_time
    status, _, headers = await stack.post(call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                              "clientInfo": {"name": "t", "version": "1"}}))
    session = {"Mcp-Session-Id": headers["Mcp-Session-Id"]}
    assert (await stack.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, **session))[0] == 202
    sleep = call("tools/call", {"name": "fault__sleep", "arguments": {"seconds": 30}}, id="slow")
    slow_call = asyncio.ensure_future(stack.post(sleep, **session))
    await eventually(lambda: bool(stack.state.inflight), what="call in flight")
    status, text, headers = await stack.post(call("calc.add", {"a": 1, "b": 1}), **session)
    assert status == 429 and "in flight" in text and headers["Retry-After"] == "1"
    await stack.add("bob")
    # Notifications hold no slot, so the client can still cancel what holds its slot.
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}}
    assert (await stack.post(cancel, **session))[0] == 202
    async with asyncio.timeout(DEADLINE):
        status, body, _ = await slow_call
    assert body["error"]["code"] == -32017
    await stack.add()


# -- the limiter's arithmetic, on a fake clock -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def refused(limiter: ClientLimiter, principal: Principal, messages: int = 1, slot: bool = False) -> HttpError:
    with pytest.raises(HttpError) as caught:
        limiter.admit(principal, messages, slot)
    assert caught.value.status == 429
    return caught.value


def test_bucket_refills_at_the_rate_and_a_big_batch_leaves_debt() -> None:
    clock = Clock()
    limiter = ClientLimiter(_Quota(max_concurrent=4, rate=2.0, burst=4), clock)
    alice = Principal(name="alice")
    limiter.admit(alice, 6, False)  # above the burst: admitted on a full bucket, 2 tokens in debt
    assert refused(limiter, alice).headers["Retry-After"] == "2"  # 3 tokens short at 2/s → 1.5 s → 2
    clock.now = 1.5
    limiter.admit(alice, 1, False)
    clock.now = 100.0  # a long pause refills only up to the burst
    limiter.admit(alice, 4, False)
    assert refused(limiter, alice).headers["Retry-After"] == "1"


def test_slots_are_per_client_and_come_back() -> None:
    limiter = ClientLimiter(_Quota(max_concurrent=1, rate=100.0, burst=100), Clock())
    alice, bob = Principal(name="alice"), Principal(name="bob")
    roomy = Principal(name="roomy", limits=ClientLimits(max_concurrent=2))
    limiter.admit(alice, 1, True)
    assert refused(limiter, alice, slot=True).headers["Retry-After"] == "1"
    limiter.admit(alice, 1, False)  # no slot needed: notifications alone
    limiter.admit(bob, 1, True)
    limiter.admit(roomy, 1, True)
    limiter.admit(roomy, 1, True)
    limiter.release("alice")
    assert limiter.in_flight("alice") == 0
    limiter.admit(alice, 1, True)


def test_a_reloaded_policy_s_limits_apply_at_once_and_the_counts_carry_over() -> None:
    clock = Clock()
    limiter = ClientLimiter(_Quota(max_concurrent=1, rate=1.0, burst=1), clock)
    alice = Principal(name="alice")
    limiter.admit(alice, 1, True)
    assert "in flight (limit 1)" in refused(limiter, alice, slot=True).reason
    lifted = Principal(name="alice", limits=ClientLimits(max_concurrent=2, rate=10.0, burst=10))
    assert "rate limit: 10 messages/s" in refused(limiter, lifted).reason  # the bucket is as it was: empty
    clock.now = 0.1
    limiter.admit(lifted, 1, True)  # refilled at the new rate; the held slot still counts
    assert limiter.in_flight("alice") == 2
    assert "in flight (limit 2)" in refused(limiter, lifted, slot=True).reason
    limiter.release("alice")
    assert "in flight (limit 1)" in refused(limiter, alice, slot=True).reason  # back to the old limits
    limiter.release("alice")
    limiter.release("alice")  # one release too many does not lend a slot
    assert limiter.in_flight("alice") == 0


def test_a_client_s_byte_quota_follows_its_message_quota_when_that_is_larger() -> None:
    clock = Clock()
    limiter = ClientLimiter(_Quota(max_concurrent=1, rate=0.1, burst=1), clock, bytes_rate=1024, bytes_burst=2048)
    small, large = Principal(name="small"), Principal(name="large", limits=ClientLimits(rate=10.0, burst=10))
    # small: 1,024 bytes/s (its own, over 0.1 × MESSAGE_BYTES), a burst of 4,096 (one message's, over its own).
    limiter.admit_bytes(small, 6144)  # more than a whole burst on a full bucket: admitted, 2,048 in debt
    with pytest.raises(HttpError) as caught:
        limiter.admit_bytes(small, 1)
    assert caught.value.headers["Retry-After"] == "3"  # 2049 bytes short at 1,024/s
    limiter.admit_bytes(large, 10 * 4096)  # ten messages' worth of MESSAGE_BYTES
    with pytest.raises(HttpError) as caught:
        limiter.admit_bytes(large, 1)
    assert "rate limit: 40960 bytes/s, burst 40960" in caught.value.reason
