"""The official Python MCP SDK (`mcp` 2.3.0) as a client of the real daemon over Streamable HTTP.

What a stock MCP client sees through the gateway: the legacy handshake (`mode="auto"` lands on the modern era,
tests/e2e/test_mcp_sdk_modern.py), exactly the tools its token's policy allows in a stable order with the children's
schemas untouched, plain JSON-RPC and MCP tools called alike, tool failures as `isError` results,
unknown and forbidden tools indistinguishable, progress streamed before the result, cancellation,
tool-list changes on the GET stream, keep-alive comments tolerated, and no access at all without a
valid bearer token.

One daemon serves the whole module (its tests only read, call and cancel); the tests that change
a tool list or need other settings start their own. The helpers at the top (`sdk_client`,
`mcp_post`, `raw_session`, `http_session`) are shared with test_mcp_server_time.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx2
import pytest
import pytest_asyncio
import tomli_w
from mcp import Client
from mcp.client.session import IncomingMessage, MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import TextContent, ToolListChangedNotification

from gatewayd.examples import clock
from tests.daemon import Daemon, faultsrv_command, python_command, write_config
from tests.fixtures.faultsrv import TOOL_SCHEMAS

# Bounds every test body: generous for a loaded CI machine, far below pytest's patience.
TEST_DEADLINE: Final = 30.0
# One request/response round trip of the SDK (it raises on expiry).
SDK_READ_TIMEOUT: Final = 20.0
ACCEPT: Final = "application/json, text/event-stream"
SESSION_HEADER: Final = "Mcp-Session-Id"
VERSION_HEADER: Final = "MCP-Protocol-Version"
LEGACY_VERSION: Final = "2025-11-25"
MODERN_VERSION: Final = "2026-07-28"
PROGRESS_STEPS: Final = 5

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The plain JSON-RPC calc declares its methods (and their schemas) in its tools.d file.
NUMBERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
CALC_METHODS: Final[dict[str, dict[str, Any]]] = {
    "add": {"description": "Add two numbers", "input_schema": NUMBERS},
    "divide": {"description": "Divide a by b", "input_schema": {**NUMBERS, "$comment": "b must not be 0"}},
    "multiply": {"description": "Multiply two numbers", "input_schema": NUMBERS},
}
ROLES: Final = """
[roles.agent]
allow = ["calc.add", "calc.divide", "clock.*", "fault.progress", "fault.echo", "fault.change_tools", "fault.extra"]

[roles.reader]
allow = ["clock.now"]
"""
# Servers sorted by name, each server's tools sorted by name; calc.multiply and every other faultsrv tool are
# denied. (faultsrv lists `extra` only after `change_tools` was called.)
AGENT_TOOLS: Final = [
    "calc__add", "calc__divide", "clock__countdown", "clock__now", "fault__change_tools", "fault__echo",
    "fault__progress",
]
READER_TOOLS: Final = ["clock__now"]


# -- shared helpers ----------------------------------------------------------------------------


@asynccontextmanager
async def sdk_client(
    url: str,
    authorization: str | None,
    *,
    mode: str = "legacy",
    event_hooks: Mapping[str, list[Any]] | None = None,
    message_handler: MessageHandlerFnT | None = None,
) -> AsyncIterator[Client]:
    """An SDK `Client` over Streamable HTTP sending `Authorization: <authorization>` (none if None)."""
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with httpx2.AsyncClient(
        headers=headers, timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT), event_hooks=dict(event_hooks or {})
    ) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(
            transport, mode=mode, read_timeout_seconds=SDK_READ_TIMEOUT, message_handler=message_handler
        ) as client:
            yield client


@asynccontextmanager
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    """A raw HTTP client on the running loop (the shared `http` fixture lives on each test's own loop)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_DEADLINE)) as session:
        yield session


def bearer(token: str) -> str:
    return f"Bearer {token}"


@dataclass
class Exchange:
    """One raw POST to /mcp: its status, headers and the JSON-RPC messages of its body (JSON or SSE)."""

    status: int
    headers: Mapping[str, str]
    content_type: str
    messages: list[dict[str, Any]]

    @property
    def response(self) -> dict[str, Any]:
        """The one JSON-RPC response (the message with an id and a result or error)."""
        answers = [m for m in self.messages if "id" in m and ("result" in m or "error" in m)]
        assert len(answers) == 1, self.messages
        return answers[0]


def session_headers(token: str, session_id: str) -> dict[str, str]:
    """The headers of a raw request in a 2025 session."""
    return {"Authorization": bearer(token), "Content-Type": "application/json", "Accept": ACCEPT,
            SESSION_HEADER: session_id, VERSION_HEADER: LEGACY_VERSION}


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a response as it reads them, each its fields ({id, retry, event, data}), comments skipped.
    Stopping after one leaves the rest of the stream to read."""
    event: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            event[field] = value.removeprefix(" ")


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body's events, in order; comments and empty (priming) events skipped."""
    messages: list[dict[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
        if "".join(data):
            messages.append(json.loads("\n".join(data)))
    return messages


async def mcp_post(
    http: aiohttp.ClientSession, url: str, token: str, message: dict[str, Any], session_id: str | None = None
) -> Exchange:
    """POST one message the way the spec says a client must (Accept: JSON and SSE; session headers after init)."""
    headers = {"Authorization": bearer(token), "Content-Type": "application/json", "Accept": ACCEPT}
    if session_id is not None:
        headers[SESSION_HEADER] = session_id
        headers[VERSION_HEADER] = LEGACY_VERSION
    async with http.post(url, json=message, headers=headers) as response:
        text = await response.text()
        if response.content_type == "text/event-stream":
            messages = sse_messages(text)
        else:
            messages = [json.loads(text)] if text and response.content_type == "application/json" else []
        return Exchange(response.status, dict(response.headers), response.content_type, messages)


async def raw_session(http: aiohttp.ClientSession, url: str, token: str,
                      capabilities: dict[str, Any] | None = None) -> str:
    """The legacy handshake by hand, declaring `capabilities`: initialize, then notifications/initialized; returns
    the session id."""
    client_info = {"name": "raw", "version": "1"}
    init = await mcp_post(http, url, token, {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": LEGACY_VERSION, "capabilities": capabilities or {}, "clientInfo": client_info},
    })
    assert init.status == 200, init
    assert init.response["result"]["protocolVersion"] == LEGACY_VERSION
    session_id = init.headers[SESSION_HEADER]
    initialized = await mcp_post(
        http, url, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id
    )
    assert (initialized.status, initialized.messages) == (202, [])
    return session_id


def text_of(result: Any) -> str:
    """The text of a CallToolResult's single text block."""
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside (possibly nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaf_exceptions(inner)]
    return [exc]


# -- the daemon under test ---------------------------------------------------------------------


@dataclass
class Gateway:
    daemon: Daemon
    agent: str  # token of the client with role `agent`
    reader: str  # token of the client with role `reader`

    @property
    def url(self) -> str:
        return self.daemon.url


def calc_config() -> str:
    declared = {"protocol": "jsonrpc", "methods": CALC_METHODS}
    return python_command("-m", "gatewayd.examples.calc") + "\n" + tomli_w.dumps(declared)


@asynccontextmanager
async def start_gateway(root: Path, env: dict[str, str] | None = None) -> AsyncIterator[Gateway]:
    tokens = write_config(
        root,
        {
            "calc": calc_config(),
            "clock": python_command("-m", "gatewayd.examples.clock"),
            "fault": faultsrv_command("--mcp"),
        },
        roles=ROLES,
        clients={"agent": ["agent"], "reader": ["reader"]},
    )
    async with Daemon(root, env=env) as daemon:
        yield Gateway(daemon, tokens["agent"], tokens["reader"])


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async with start_gateway(tmp_path_factory.mktemp("gateway")) as started:
        yield started


# -- connecting --------------------------------------------------------------------------------


async def test_legacy_client_connects_with_a_bearer_token(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        assert client.protocol_version == LEGACY_VERSION
        assert client.server_info is not None and client.server_info.name == "gatewayd"
        tools = client.server_capabilities.tools
        assert tools is not None and tools.list_changed is True
        with pytest.warns(MCPDeprecationWarning, match="ping is removed as of 2026-07-28"):
            await client.send_ping()


async def test_auto_mode_probes_discover_and_stays_in_the_modern_era(gateway: Gateway) -> None:
    wire: list[tuple[str, str | None, int]] = []

    async def record(response: httpx2.Response) -> None:
        request = response.request
        method = json.loads(request.content)["method"] if request.method == "POST" else request.method
        wire.append((method, request.headers.get(VERSION_HEADER), response.status_code))

    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_client(gateway.url, bearer(gateway.agent), mode="auto", event_hooks={"response": [record]}) as client,
    ):
        assert client.protocol_version == MODERN_VERSION
        assert [tool.name for tool in (await client.list_tools()).tools] == AGENT_TOOLS
        assert text_of(await client.call_tool("calc__add", {"a": 1, "b": 2})) == "3"
    # The gateway answers the 2026 probe (tests/e2e/test_mcp_sdk_modern.py): no `initialize`, no session, every
    # request carries the modern version.
    assert wire[0] == ("server/discover", MODERN_VERSION, 200)
    assert all(version == MODERN_VERSION and method != "initialize" for method, version, _ in wire), wire


async def refused_statuses(url: str, authorization: str | None) -> list[tuple[int, str | None]]:
    """Connect with this Authorization header, expecting the SDK to fail; the (status, challenge) it saw."""
    statuses: list[tuple[int, str | None]] = []

    async def record(response: httpx2.Response) -> None:
        statuses.append((response.status_code, response.headers.get("WWW-Authenticate")))

    with pytest.raises(Exception) as failure:
        async with sdk_client(url, authorization, event_hooks={"response": [record]}):
            pytest.fail("connected without a valid token")
    assert any(isinstance(leaf, MCPError) for leaf in leaf_exceptions(failure.value)), failure.value
    return statuses


async def test_no_or_a_wrong_token_is_refused_with_401(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        missing = await refused_statuses(gateway.url, None)
        wrong = await refused_statuses(gateway.url, "Bearer gwd_not-a-real-token")
        not_bearer = await refused_statuses(gateway.url, f"Basic {gateway.agent}")
    # The very first request (initialize) is refused; nothing else is tried.
    assert missing == [(401, 'Bearer realm="gatewayd"')]
    assert wrong == [(401, 'Bearer realm="gatewayd", error="invalid_token"')]
    assert not_bearer == [(401, 'Bearer realm="gatewayd"')]


# -- listing -----------------------------------------------------------------------------------


async def test_list_tools_is_exactly_what_the_policy_allows_in_a_stable_order(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        async with sdk_client(gateway.url, bearer(gateway.agent)) as client:
            first = [tool.name for tool in (await client.list_tools()).tools]
            again = [tool.name for tool in (await client.list_tools()).tools]
        async with sdk_client(gateway.url, bearer(gateway.agent)) as client:
            other_session = [tool.name for tool in (await client.list_tools()).tools]
    assert first == AGENT_TOOLS
    assert again == first
    assert other_session == first


async def test_input_schemas_pass_through_verbatim(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    # Plain JSON-RPC: what the tools.d file declares.
    for method in ("add", "divide"):
        tool = listed[f"calc__{method}"]
        assert tool.input_schema == CALC_METHODS[method]["input_schema"]
        assert tool.description == CALC_METHODS[method]["description"]
    # MCP: the child's whole tool description, only the name changed.
    for declared in clock.TOOLS:
        tool = listed[f"clock__{declared.name}"]
        expected = {**declared.describe(), "name": f"clock__{declared.name}"}
        assert tool.model_dump(mode="json", by_alias=True, exclude_none=True) == expected
    for method in ("echo", "progress"):
        schema = {"type": "object", "properties": TOOL_SCHEMAS[method]}
        assert listed[f"fault__{method}"].input_schema == schema


async def test_clients_with_different_tokens_see_different_tools(gateway: Gateway) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_client(gateway.url, bearer(gateway.agent)) as agent,
        sdk_client(gateway.url, bearer(gateway.reader)) as reader,
    ):
        agent_tools, reader_tools = await asyncio.gather(agent.list_tools(), reader.list_tools())
        assert [tool.name for tool in agent_tools.tools] == AGENT_TOOLS
        assert [tool.name for tool in reader_tools.tools] == READER_TOOLS
        result = await reader.call_tool("clock__now", {"timezone": "UTC"})
        assert result.is_error is False
        with pytest.raises(MCPError, match="^Unknown tool: calc__add$"):
            await reader.call_tool("calc__add", {"a": 1, "b": 2})


# -- calling -----------------------------------------------------------------------------------


async def test_call_a_plain_jsonrpc_tool(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        result = await client.call_tool("calc__add", {"a": 2, "b": 3.5})
    assert result.is_error is False
    assert result.structured_content == {"result": 5.5}
    assert text_of(result) == "5.5"


async def test_call_an_mcp_tool(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        result = await client.call_tool("clock__now", {"timezone": "UTC"})
    assert result.is_error is False
    assert result.structured_content is not None
    assert result.structured_content["timezone"] == "UTC"
    assert text_of(result) == result.structured_content["iso"]
    assert result.structured_content["iso"].endswith("+00:00")


async def test_a_tool_failure_is_an_is_error_result(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        failed = await client.call_tool("calc__divide", {"a": 1, "b": 0})
        assert failed.is_error is True
        assert text_of(failed) == "division by zero"
        # A tool error is not a broken session.
        after = await client.call_tool("calc__divide", {"a": 1, "b": 4})
    assert after.is_error is False
    assert after.structured_content == {"result": 0.25}


async def test_unknown_and_forbidden_tools_fail_the_same_way(gateway: Gateway) -> None:
    async def outcome(client: Client, name: str) -> tuple[int, str, Any]:
        with pytest.raises(MCPError) as failure:
            await client.call_tool(name, {"a": 1, "b": 2})
        error = failure.value.error
        return error.code, error.message.replace(name, "<name>"), error.data

    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_client(gateway.url, bearer(gateway.agent)) as agent,
        sdk_client(gateway.url, bearer(gateway.reader)) as reader,
    ):
        forbidden = [
            await outcome(agent, "calc__multiply"),  # declared by calc, not granted
            await outcome(agent, "fault__pid"),  # an MCP child's tool, not granted
            await outcome(reader, "clock__countdown"),  # granted to the agent, not to this client
            await outcome(reader, "calc__add"),  # on a server this client may use nothing of
        ]
        unknown = [
            await outcome(agent, "calc__power"),  # no such method
            await outcome(agent, "nosuch__tool"),  # no such server
            await outcome(reader, "nosuch__tool"),
            await outcome(agent, "calc.add"),  # a canonical name is not a tool name
        ]
    assert set(forbidden) == set(unknown) == {(-32602, "Unknown tool: <name>", None)}


async def test_progress_callback_gets_every_notification_of_a_streamed_call(gateway: Gateway) -> None:
    received: list[tuple[float, float | None, str | None]] = []
    all_received = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))
        if len(received) == PROGRESS_STEPS:
            all_received.set()

    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        result = await client.call_tool("fault__progress", {"steps": PROGRESS_STEPS}, progress_callback=on_progress)
        # The SDK runs progress callbacks as tasks of their own; they were received before the result
        # (see the wire test below), so they finish without anything new arriving.
        await all_received.wait()
    assert result.is_error is False
    assert result.structured_content == {"value": {"steps": PROGRESS_STEPS}}
    expected = [(float(step), float(PROGRESS_STEPS), f"step {step}") for step in range(1, PROGRESS_STEPS + 1)]
    assert received == expected


async def test_progress_is_streamed_before_the_result_on_the_wire(gateway: Gateway) -> None:
    """clock__countdown reports once a second: each progress event arrives as it happens, the result last."""
    seconds = 2
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        session_id = await raw_session(http, gateway.url, gateway.agent)
        params = {"name": "clock__countdown", "arguments": {"seconds": seconds}, "_meta": {"progressToken": "tok"}}
        call = {"jsonrpc": "2.0", "id": "count", "method": "tools/call", "params": params}
        headers = {
            "Authorization": bearer(gateway.agent), "Content-Type": "application/json", "Accept": ACCEPT,
            SESSION_HEADER: session_id, VERSION_HEADER: LEGACY_VERSION,
        }
        arrivals: list[tuple[float, dict[str, Any]]] = []
        async with http.post(gateway.url, json=call, headers=headers) as response:
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            buffer = ""
            async for chunk in response.content.iter_any():
                buffer += chunk.decode()
                *events, buffer = buffer.replace("\r\n", "\n").split("\n\n")
                arrivals.extend((time.monotonic(), message) for message in sse_messages("\n\n".join(events)))
    messages = [message for _, message in arrivals]
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert progress == [
        {"progressToken": "tok", "progress": step, "total": seconds, "message": f"{step}/{seconds}"}
        for step in range(1, seconds + 1)
    ]
    assert messages[-1] == {
        "jsonrpc": "2.0", "id": "count", "result": {"content": [{"type": "text", "text": "done"}], "isError": False},
    }
    # Streamed, not buffered until the end: the first step arrived about a second before the result.
    first_progress = next(at for at, m in arrivals if m.get("method") == "notifications/progress")
    assert arrivals[-1][0] - first_progress > 0.5


async def test_a_changed_tool_list_is_announced_to_the_sdk_client(tmp_path: Path) -> None:
    changed = asyncio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            changed.set()

    async with (
        asyncio.timeout(TEST_DEADLINE),
        start_gateway(tmp_path) as gateway,  # its own: the change sticks to the fault server
        sdk_client(gateway.url, bearer(gateway.agent), message_handler=on_message) as client,
    ):
        assert [tool.name for tool in (await client.list_tools()).tools] == AGENT_TOOLS
        await client.call_tool("fault__change_tools", {})
        await changed.wait()  # on the session's GET stream
        after = [tool.name for tool in (await client.list_tools()).tools]
    assert after == sorted([*AGENT_TOOLS, "fault__extra"])


async def test_cancelling_an_sdk_call_cancels_it_at_the_gateway(gateway: Gateway) -> None:
    first_step = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        first_step.set()

    async with asyncio.timeout(TEST_DEADLINE), sdk_client(gateway.url, bearer(gateway.agent)) as client:
        call = asyncio.ensure_future(
            client.call_tool("clock__countdown", {"seconds": 30}, progress_callback=on_progress)
        )
        await first_step.wait()
        call.cancel()  # the SDK sends notifications/cancelled for the request
        with pytest.raises(asyncio.CancelledError):
            await call
        await gateway.daemon.wait_log(r"client=agent cancelled request")
        # The session goes on.
        after = await client.call_tool("calc__add", {"a": 1, "b": 1})
    assert after.structured_content == {"result": 2}


async def test_sdk_client_ignores_sse_keep_alive_comments(tmp_path: Path) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        start_gateway(tmp_path, {"GATEWAYD_SSE_KEEPALIVE": "0.05"}) as gateway,
        http_session() as http,
    ):
        # The setting took: a quiet GET stream carries keep-alive comments.
        session_id = await raw_session(http, gateway.url, gateway.agent)
        headers = {
            "Authorization": bearer(gateway.agent), "Accept": "text/event-stream",
            SESSION_HEADER: session_id, VERSION_HEADER: LEGACY_VERSION,
        }
        async with http.get(gateway.url, headers=headers) as stream:
            assert stream.status == 200
            priming = [await stream.content.readline() for _ in range(4)]  # its id, retry, empty data, the end
            assert priming[0].startswith(b"id: ") and priming[2:] == [b"data:\n", b"\n"]
            assert await stream.content.readline() == b": keep-alive\n"
        # About twenty of them interleave with the progress of a one-second call, on its POST stream
        # and on the SDK's GET stream.
        progressed = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            progressed.set()

        async with sdk_client(gateway.url, bearer(gateway.agent)) as client:
            result = await client.call_tool("clock__countdown", {"seconds": 1}, progress_callback=on_progress)
            await progressed.wait()
    assert result.is_error is False
    assert text_of(result) == "done"
