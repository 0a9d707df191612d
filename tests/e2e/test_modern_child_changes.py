"""What a 2026-07-28 child says changed reaches the gateway's callers, through the real daemon and a child written with
the official SDK (tests/fixtures/modernwatch.py), which tells of changes only on a `subscriptions/listen` stream.

The gateway opens one listen on the child: its tool list changing reaches a legacy session's GET stream and the next
`tools/list` shows the new tool; a session's `resources/subscribe` of the child's resource (a method that era no
longer has) joins the listen, and the resource's updates reach the session that holds it, without the child's
subscription id; a modern caller's own `subscriptions/listen` gets them the same way; a new child is listened to again.
The child is asked per request for the log lines its caller hears (that era writes none unasked).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from mcp.client.session import IncomingMessage
from mcp_types import LoggingMessageNotification

from tests.daemon import REPO, Daemon, gatewayctl, python_command, write_config
from tests.e2e.test_mcp_sdk import MODERN_VERSION, TEST_DEADLINE, bearer, sdk_client, sse_messages, text_of
from tests.e2e.test_mcp_sdk_modern import headers, request
from tests.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHILD: Final = REPO / "tests" / "fixtures" / "modernwatch.py"
LEGACY_VERSION: Final = "2025-11-25"
ITEM: Final = "watch://item/1"
OTHER: Final = "watch://item/2"
# Bounds each read of a stream.
READ_DEADLINE: Final = 10.0


@dataclass
class Rig:
    daemon: Daemon
    root: Path
    token: str


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("modern-changes")
    tokens = write_config(root, {"watch": python_command(str(CHILD)) + '\nera = "2026-07-28"\n'},
                          roles='[roles.user]\nallow = ["watch.*", "watch.resources/read"]\n',
                          clients={"user": ["user"]})
    async with Daemon(root) as daemon:
        yield Rig(daemon, root, tokens["user"])


class Session:
    """A legacy MCP session over raw HTTP, its GET stream open for what it is sent."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        self.http, self.url, self.token, self.id = http, url, token, ""
        self.stream: aiohttp.ClientResponse | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": bearer(self.token), "Mcp-Session-Id": self.id, "MCP-Protocol-Version": LEGACY_VERSION,
                "Accept": "application/json, text/event-stream"}

    async def open(self) -> Session:
        async with self.http.post(self.url, headers={"Authorization": bearer(self.token)}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
                ) as response:
            assert response.status == 200, await response.text()
            self.id = response.headers["Mcp-Session-Id"]
        self.stream = await self.http.get(self.url, headers={**self._headers(), "Accept": "text/event-stream"})
        assert self.stream.status == 200
        return self

    async def __call__(self, method: str, params: Any = None) -> dict[str, Any]:
        sent = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        async with self.http.post(self.url, headers={**self._headers(), "Accept": "application/json"},
                                  json=sent) as response:
            answer: dict[str, Any] = await response.json()
            return answer

    async def notification(self) -> dict[str, Any]:
        """The next message on the GET stream."""
        assert self.stream is not None
        async with asyncio.timeout(READ_DEADLINE):
            while not (line := await self.stream.content.readline()).startswith(b"data: "):
                pass
        message: dict[str, Any] = json.loads(line[6:])
        return message

    async def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        async with self.http.delete(self.url, headers=self._headers()) as response:
            assert response.status in (200, 204)


async def test_a_modern_childs_changes_reach_legacy_sessions(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http:
        session = await Session(http, rig.daemon.url, rig.token).open()
        names = {tool["name"] for tool in (await session("tools/list"))["result"]["tools"]}
        assert "watch__grown" not in names
        assert (await session("tools/call", {"name": "watch__grow", "arguments": {}}))["result"]["isError"] is False
        assert await session.notification() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        names = {tool["name"] for tool in (await session("tools/list"))["result"]["tools"]}
        assert "watch__grown" in names

        # resources/subscribe, which the child's era does not have, joins the gateway's listen.
        assert (await session("resources/subscribe", {"uri": ITEM}))["result"] == {}
        for uri in (OTHER, ITEM):
            touched = await session("tools/call", {"name": "watch__touch", "arguments": {"uri": uri}})
            assert touched["result"]["content"][0]["text"] == f"touched {uri}"
        # Only the URI held, and without the child's id of the gateway's listen.
        assert await session.notification() == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                                 "params": {"uri": ITEM}}

        # A new child is listened to again, the subscription with it.
        code, _, err = await gatewayctl(rig.root, "restart", "watch")
        assert code == 0, err
        await session("tools/call", {"name": "watch__add", "arguments": {"a": 1, "b": 2}})
        await session("tools/call", {"name": "watch__touch", "arguments": {"uri": ITEM}})
        message = await session.notification()
        while message["method"] != "notifications/resources/updated":
            message = await session.notification()
        assert message["params"] == {"uri": ITEM}

        # Its last holder lets go: the gateway listens without it.
        seen = len(rig.daemon.logs)
        assert (await session("resources/unsubscribe", {"uri": ITEM}))["result"] == {}
        await eventually(lambda: any("listening for changes of its lists and of 0 resources" in line
                                     for line in rig.daemon.logs[seen:]), what="listening without the resource")
        await session.close()


async def test_a_modern_callers_listen_hears_a_modern_childs_resource(rig: Rig) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = request("subscriptions/listen", {"notifications": {"resourceSubscriptions": [ITEM]}}, meta)
    async with asyncio.timeout(TEST_DEADLINE), aiohttp.ClientSession() as http, \
            http.post(rig.daemon.url, data=json.dumps(body),
                      headers=headers(rig.token, "subscriptions/listen")) as stream:
        assert stream.content_type == "text/event-stream"

        async def frame() -> dict[str, Any]:
            async with asyncio.timeout(READ_DEADLINE):
                while not (line := await stream.content.readline()).startswith(b"data:"):
                    pass
            message: dict[str, Any] = json.loads(line[5:])
            return message

        ack = await frame()
        assert ack["params"]["notifications"] == {"resourceSubscriptions": [ITEM]}
        call = request("tools/call", {"name": "watch__touch", "arguments": {"uri": ITEM}}, meta, request_id=8)
        async with http.post(rig.daemon.url, data=json.dumps(call),
                             headers=headers(rig.token, "tools/call", "watch__touch")) as response:
            assert response.status == 200
        updated = await frame()
    assert updated["method"] == "notifications/resources/updated"
    # The caller's own subscription id, not the child's.
    assert updated["params"] == {"uri": ITEM, "_meta": {"io.modelcontextprotocol/subscriptionId": 7}}


async def test_a_modern_child_is_asked_for_the_log_lines_its_caller_hears(rig: Rig) -> None:
    said: list[Any] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, LoggingMessageNotification):
            said.append(message.params.data)

    async with asyncio.timeout(TEST_DEADLINE):
        # A legacy session hears every level until it sets one.
        async with sdk_client(rig.daemon.url, bearer(rig.token), message_handler=on_message) as client:
            assert text_of(await client.call_tool("watch__say", {"text": "hi"})) == "hi"
        assert said == ["saying hi"]
        # A modern caller hears what its request asks for, and nothing without asking.
        for level, expected in (("info", ["saying hi"]), ("warning", []), (None, [])):
            meta: dict[str, Any] = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                                    "io.modelcontextprotocol/clientCapabilities": {}}
            if level is not None:
                meta["io.modelcontextprotocol/logLevel"] = level
            body = request("tools/call", {"name": "watch__say", "arguments": {"text": "hi"}}, meta)
            async with aiohttp.ClientSession() as http, \
                    http.post(rig.daemon.url, data=json.dumps(body),
                              headers=headers(rig.token, "tools/call", "watch__say")) as response:
                text = await response.text()
            messages = sse_messages(text) if response.content_type == "text/event-stream" else [json.loads(text)]
            assert [m["params"]["data"] for m in messages if m.get("method") == "notifications/message"] == expected
            assert messages[-1]["result"]["content"][0]["text"] == "hi"
