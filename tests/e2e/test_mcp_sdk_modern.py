"""MCP 2026-07-28 (the modern, stateless era) against the real daemon: the official SDK pinned to it, a legacy SDK
client on the same daemon at the same time, and the wire rules a stock client does not exercise.

The SDK in `mode="2026-07-28"` lists and calls tools with no `initialize` and no session, gets progress during a
call, and cannot tell a denied tool from an unknown one. Raw POSTs check the validation ladder (each error as JSON
with the spec's status and code), removed methods, that closing a call's stream cancels it, and that
`subscriptions/listen` tells each client only of changes to what it may see. Shares the daemon and helpers of
test_mcp_sdk.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from mcp.shared.exceptions import MCPError

from gatewayd.listeners import MAX_LISTENERS_PER_CLIENT
from tests.daemon import status as daemon_status
from tests.e2e.test_mcp_sdk import (
    AGENT_TOOLS,
    LEGACY_VERSION,
    MODERN_VERSION,
    PROGRESS_STEPS,
    READER_TOOLS,
    TEST_DEADLINE,
    Gateway,
    bearer,
    sdk_client,
    sse_messages,
    start_gateway,
    text_of,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

META: Final = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
ACCEPT: Final = "application/json, text/event-stream"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    async with start_gateway(tmp_path_factory.mktemp("modern")) as started:
        yield started


def headers(token: str | None, method: str, name: str | None = None, version: str = MODERN_VERSION,
            **extra: str) -> dict[str, str]:
    """The headers a modern client sends with `method` (and `name`, for a named method)."""
    sent = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": version,
            "Mcp-Method": method}
    if token is not None:
        sent["Authorization"] = bearer(token)
    if name is not None:
        sent["Mcp-Name"] = name
    return {**sent, **extra}


async def post(url: str, body: Any, sent: dict[str, str]) -> tuple[int, str, dict[str, Any]]:
    """POST a body; (status, content type, the one JSON-RPC response, from JSON or SSE)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_DEADLINE)) as http, \
            http.post(url, data=json.dumps(body), headers=sent) as response:
        text = await response.text()
        if response.content_type == "text/event-stream":
            answers = [m for m in sse_messages(text) if "id" in m]
            return response.status, response.content_type, answers[-1]
        if response.content_type != "application/json":
            return response.status, response.content_type, {}
        return response.status, response.content_type, json.loads(text)


def request(method: str, params: dict[str, Any] | None = None, meta: dict[str, Any] | None = META,
            request_id: int = 7) -> dict[str, Any]:
    body_params = dict(params or {})
    if meta is not None:
        body_params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": body_params}


# -- the SDK, pinned to 2026-07-28, beside a legacy one ------------------------------------------


async def test_a_modern_sdk_client_lists_and_calls_without_a_session(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), \
            sdk_client(gateway.url, bearer(gateway.agent), mode=MODERN_VERSION) as client:
        assert client.protocol_version == MODERN_VERSION
        assert [tool.name for tool in (await client.list_tools()).tools] == AGENT_TOOLS
        assert text_of(await client.call_tool("calc__add", {"a": 2, "b": 3})) == "5"
        failed = await client.call_tool("calc__divide", {"a": 1, "b": 0})
        assert failed.is_error is True


async def test_a_modern_client_gets_progress_during_its_call(gateway: Gateway) -> None:
    received: list[float] = []
    all_received = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(progress)
        if len(received) == PROGRESS_STEPS:
            all_received.set()

    async with asyncio.timeout(TEST_DEADLINE), \
            sdk_client(gateway.url, bearer(gateway.agent), mode=MODERN_VERSION) as client:
        result = await client.call_tool("fault__progress", {"steps": PROGRESS_STEPS}, progress_callback=on_progress)
        await all_received.wait()  # the SDK runs progress callbacks as tasks of their own
    assert result.structured_content == {"value": {"steps": PROGRESS_STEPS}}
    assert received == [float(step) for step in range(1, PROGRESS_STEPS + 1)]


async def test_denied_and_unknown_tools_look_alike_to_a_modern_client(gateway: Gateway) -> None:
    async def outcome(token: str, name: str) -> tuple[int, str]:
        async with sdk_client(gateway.url, bearer(token), mode=MODERN_VERSION) as client:
            with pytest.raises(MCPError) as failure:
                await client.call_tool(name, {"a": 1, "b": 2})
        return failure.value.error.code, failure.value.error.message.replace(name, "<name>")

    async with asyncio.timeout(TEST_DEADLINE):
        denied = {await outcome(gateway.agent, "calc__multiply"), await outcome(gateway.reader, "calc__add")}
        unknown = {await outcome(gateway.agent, "calc__power"), await outcome(gateway.reader, "nosuch__tool")}
    assert denied == unknown == {(-32602, "Unknown tool: <name>")}
    # Raw: the same status too.
    for token, name in ((gateway.agent, "calc__multiply"), (gateway.agent, "calc__power")):
        status, _, answer = await post(gateway.url, request("tools/call", {"name": name, "arguments": {}}),
                                       headers(token, "tools/call", name))
        assert (status, answer["error"]["code"]) == (400, -32602)


async def test_one_daemon_serves_a_modern_and_a_legacy_client_at_once(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), \
            sdk_client(gateway.url, bearer(gateway.agent), mode=MODERN_VERSION) as modern_client, \
            sdk_client(gateway.url, bearer(gateway.reader), mode="legacy") as legacy_client:
        assert (modern_client.protocol_version, legacy_client.protocol_version) == (MODERN_VERSION, LEGACY_VERSION)
        modern_tools, legacy_tools = await asyncio.gather(modern_client.list_tools(), legacy_client.list_tools())
        assert [tool.name for tool in modern_tools.tools] == AGENT_TOOLS
        assert [tool.name for tool in legacy_tools.tools] == READER_TOOLS
        added, now = await asyncio.gather(modern_client.call_tool("calc__add", {"a": 1, "b": 1}),
                                          legacy_client.call_tool("clock__now", {}))
        assert text_of(added) == "2" and now.is_error is False


# -- the wire ------------------------------------------------------------------------------------


async def test_each_rung_of_the_ladder_answers_json_with_its_status_and_code(gateway: Gateway) -> None:
    token, url = gateway.agent, gateway.url
    cases: list[tuple[dict[str, Any], dict[str, str], int, int]] = [
        # No `_meta`, a missing field, a mistyped one: -32602.
        (request("tools/list", meta=None), headers(token, "tools/list"), 400, -32602),
        (request("tools/list", meta={**META, "io.modelcontextprotocol/clientCapabilities": "all"}),
         headers(token, "tools/list"), 400, -32602),
        # Headers contradicting the body: -32020.
        (request("tools/list"), headers(token, "tools/call"), 400, -32020),
        (request("tools/call", {"name": "calc__add", "arguments": {"a": 1, "b": 1}}),
         headers(token, "tools/call", "calc__divide"), 400, -32020),
        (request("tools/list", meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}),
         headers(token, "tools/list"), 400, -32020),
        # A version not served: -32022.
        (request("tools/list", meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}),
         headers(token, "tools/list", version="2099-01-01"), 400, -32022),
        # Methods the era removed, and unknown ones: 404 + -32601.
        (request("ping"), headers(token, "ping"), 404, -32601),
        (request("logging/setLevel", {"level": "info"}), headers(token, "logging/setLevel"), 404, -32601),
        (request("resources/subscribe", {"uri": "x://y"}), headers(token, "resources/subscribe"), 404, -32601),
        (request("initialize"), headers(token, "initialize"), 404, -32601),
        (request("nosuch/method"), headers(token, "nosuch/method"), 404, -32601),
    ]
    for body, sent, status, code in cases:
        got_status, content_type, answer = await post(url, body, sent)
        assert (got_status, content_type, answer["id"], answer["error"]["code"]) == (
            status, "application/json", 7, code), (body, answer)
    _, _, unsupported = await post(url, cases[5][0], cases[5][1])
    assert unsupported["error"]["data"] == {"supported": [MODERN_VERSION], "requested": "2099-01-01"}


async def test_a_modern_request_without_a_token_is_refused_like_any_other(gateway: Gateway) -> None:
    status, _, _ = await post(gateway.url, request("tools/list"), headers(None, "tools/list"))
    assert status == 401


async def test_discover_and_every_result_carry_the_modern_fields(gateway: Gateway) -> None:
    status, _, discovered = await post(gateway.url, request("server/discover"),
                                       headers(gateway.agent, "server/discover"))
    result = discovered["result"]
    assert status == 200 and result["supportedVersions"] == [MODERN_VERSION]
    assert result["resultType"] == "complete" and "tasks" not in result["capabilities"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gatewayd"
    _, _, listed = await post(gateway.url, request("tools/list"), headers(gateway.agent, "tools/list"))
    assert (listed["result"]["ttlMs"], listed["result"]["cacheScope"]) == (0, "private")
    _, _, called = await post(gateway.url, request("tools/call", {"name": "calc__add", "arguments": {"a": 1, "b": 1}}),
                              headers(gateway.agent, "tools/call", "calc__add"))
    assert called["result"]["resultType"] == "complete" and "ttlMs" not in called["result"]


async def test_closing_the_response_stream_cancels_the_call(gateway: Gateway) -> None:
    body = request("tools/call", {"name": "clock__countdown", "arguments": {"seconds": 30}},
                   meta={**META, "progressToken": "p"})
    async with asyncio.timeout(TEST_DEADLINE):
        async with aiohttp.ClientSession() as http, \
                http.post(gateway.url, data=json.dumps(body),
                          headers=headers(gateway.agent, "tools/call", "clock__countdown")) as response:
            assert response.content_type == "text/event-stream"
            await response.content.readuntil(b"notifications/progress")
        await gateway.daemon.wait_log(r"client=agent closed the stream of tools/call: cancelled")


async def test_a_notification_that_cannot_be_encoded_is_left_out_of_the_stream_and_said(gateway: Gateway) -> None:
    # The child escaped a lone surrogate in one progress message (valid JSON with no UTF-8 form): the stream goes on
    # without it, as in a 2025 session (tests/web/test_endpoint.py), and the daemon's log says what was left out.
    body = request("tools/call", {"name": "fault__progress", "arguments": {"steps": 4, "unsendable": 2}},
                   meta={**META, "progressToken": "odd"})
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http, \
            http.post(gateway.url, data=json.dumps(body),
                      headers=headers(gateway.agent, "tools/call", "fault__progress")) as response:
        assert response.content_type == "text/event-stream"
        messages = sse_messages(await response.text())
    assert [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"] == [1, 3, 4]
    assert messages[-1]["id"] == 7 and messages[-1]["result"]["resultType"] == "complete"
    await gateway.daemon.wait_log(r"client=agent 1 notifications not sent: not encodable as JSON text")


# -- subscriptions/listen --------------------------------------------------------------------------


async def listen(url: str, token: str, frames: list[dict[str, Any]], arrived: asyncio.Event) -> None:
    """Hold a listen stream for tool list changes, collecting its messages."""
    body = request("subscriptions/listen", {"notifications": {"toolsListChanged": True, "promptsListChanged": False}})
    async with aiohttp.ClientSession() as http, \
            http.post(url, data=json.dumps(body), headers=headers(token, "subscriptions/listen")) as response:
        async for line in response.content:
            if line.startswith(b"data:"):
                frames.append(json.loads(line[5:]))
                arrived.set()


async def test_listeners_hear_only_of_changes_to_what_they_may_see(tmp_path: Path) -> None:
    async with asyncio.timeout(TEST_DEADLINE), start_gateway(tmp_path) as own:
        agent_frames: list[dict[str, Any]] = []
        reader_frames: list[dict[str, Any]] = []
        agent_event, reader_event = asyncio.Event(), asyncio.Event()
        listeners = [asyncio.ensure_future(listen(own.url, own.agent, agent_frames, agent_event)),
                     asyncio.ensure_future(listen(own.url, own.reader, reader_frames, reader_event))]
        try:
            await agent_event.wait()
            await reader_event.wait()
            assert [frame["method"] for frame in agent_frames + reader_frames] == [
                "notifications/subscriptions/acknowledged"] * 2
            assert agent_frames[0]["params"]["notifications"] == {"toolsListChanged": True}
            agent_event.clear()
            # The agent may see `fault`; the reader may not: only the agent's stream hears that its tools changed.
            _, _, changed = await post(own.url, request("tools/call", {"name": "fault__change_tools", "arguments": {}}),
                                       headers(own.agent, "tools/call", "fault__change_tools"))
            assert "result" in changed, changed
            await agent_event.wait()
            assert agent_frames[1]["method"] == "notifications/tools/list_changed"
            assert agent_frames[1]["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7}
            # The reader's stream is still open and heard nothing but its acknowledgement; a keep-alive-free check:
            # the agent's notification was written after the broadcast reached every listener.
            assert len(reader_frames) == 1
        finally:
            for task in listeners:
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)


async def first_data(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The message of a stream's first event."""
    async for line in response.content:
        if line.startswith(b"data:"):
            message: dict[str, Any] = json.loads(line[5:])
            return message
    raise AssertionError("the stream ended without an event")


async def listeners_open(gateway: Gateway) -> int:
    """Open `subscriptions/listen` streams, as `gatewayctl status` shows them."""
    shown = await daemon_status(gateway.daemon.config_dir)
    return int(shown["listeners"])


async def test_a_listen_stream_its_client_closed_frees_its_slot_at_once(gateway: Gateway) -> None:
    body = request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http:
        before = await listeners_open(gateway)
        response = await http.post(gateway.url, data=json.dumps(body), headers=headers(gateway.agent,
                                                                                        "subscriptions/listen"))
        assert (await first_data(response))["method"] == "notifications/subscriptions/acknowledged"
        assert await listeners_open(gateway) == before + 1
        response.close()
        # Not at the next keep-alive's write (15 s): as the connection closes.
        while await listeners_open(gateway) != before:
            pass


async def test_a_client_past_its_share_of_listen_streams_has_its_oldest_ended_and_still_calls(
        gateway: Gateway) -> None:
    body = request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http:
        streams = []
        for _ in range(MAX_LISTENERS_PER_CLIENT + 1):
            response = await http.post(gateway.url, data=json.dumps(body),
                                       headers=headers(gateway.agent, "subscriptions/listen"))
            assert response.status == 200
            assert (await first_data(response))["method"] == "notifications/subscriptions/acknowledged"
            streams.append(response)
        # The oldest ended, with the listen's result (as when the daemon ends it); the newest is open.
        oldest = [json.loads(line[5:]) async for line in streams[0].content if line.startswith(b"data:")]
        assert await listeners_open(gateway) == MAX_LISTENERS_PER_CLIENT
        # A listen stream is no call in flight: with as many open as calls it may make at once, the client calls.
        code, _, called = await post(gateway.url, request("tools/call", {"name": "calc__add",
                                                                         "arguments": {"a": 1, "b": 2}}),
                                     headers(gateway.agent, "tools/call", "calc__add"))
        for response in streams:
            response.close()
    assert oldest[-1]["id"] == 7 and "result" in oldest[-1]
    assert code == 200 and called["result"]["structuredContent"] == {"result": 3}
