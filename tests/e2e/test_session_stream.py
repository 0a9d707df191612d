"""A 2025 session's own GET stream survives its connection: a client that reconnects is not refused while the gateway
still holds the connection it lost, and one naming the last event it got is sent what it missed (gatewayd/resumable.py
SessionStream, web/mcp_http.py), through the real daemon and with the official SDK's client.

What the session hears outside its calls here is the fault fixture's `change_tools`: each call makes the child say its
tools changed, and the gateway tells the session on its GET stream. A network that goes away without a word is
tests/outage.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio
from mcp.client.session import IncomingMessage
from mcp_types import ToolListChangedNotification

from gatewayd.resumable import RETRY_MS
from tests.daemon import Daemon, faultsrv_command, status, write_config
from tests.e2e.test_mcp_sdk import (
    TEST_DEADLINE,
    bearer,
    http_session,
    mcp_post,
    raw_session,
    sdk_client,
    session_headers,
    sse_events,
)
from tests.outage import behind_outage

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIST_CHANGED: Final = "notifications/tools/list_changed"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Daemon, str]]:
    root = tmp_path_factory.mktemp("session-stream")
    tokens = write_config(root, {"fault": faultsrv_command("--mcp") + '\nprotocol = "mcp"\n'},
                          '[roles.agent]\nallow = ["fault.*"]\n', {"agent": ["agent"]})
    async with Daemon(root) as running:
        yield running, tokens["agent"]


async def change_tools(http: aiohttp.ClientSession, running: Daemon, token: str, session_id: str) -> None:
    """Make the child say its tools changed (the session hears it on its GET stream before this returns)."""
    changed = await mcp_post(http, running.url, token, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                        "params": {"name": "fault__change_tools"}}, session_id)
    assert changed.status == 200 and "result" in changed.response, changed


def get_headers(token: str, session_id: str, last_event_id: str | None = None) -> dict[str, str]:
    headers = {**session_headers(token, session_id), "Accept": "text/event-stream"}
    return {**headers, "Last-Event-ID": last_event_id} if last_event_id is not None else headers


async def stream_open(running: Daemon, session_id: str) -> bool:
    """Whether `gatewayctl status` shows a connection reading the session's GET stream."""
    shown = await status(running.config_dir)
    [session] = [entry for entry in shown["session_list"] if session_id.startswith(entry["id"])]
    return bool(session["stream_open"])


async def told(events: AsyncIterator[dict[str, str]]) -> dict[str, Any]:
    """The next event of a session stream: its id and message."""
    event = await anext(events)
    return {"id": event["id"], **json.loads(event["data"])}


async def test_a_reconnection_naming_its_last_event_takes_the_stream_over_and_misses_nothing(
        daemon: tuple[Daemon, str]) -> None:
    running, token = daemon
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        session_id = await raw_session(http, running.url, token)
        lost = await http.get(running.url, headers=get_headers(token, session_id))
        lost_events = sse_events(lost)
        priming = await anext(lost_events)
        # The client stops hearing this connection (a network gone: the gateway cannot tell) and the session is told
        # two things meanwhile, written to it.
        await change_tools(http, running, token, session_id)
        await change_tools(http, running, token, session_id)
        # Without naming an event, a second reader is refused while the first connection holds.
        async with http.get(running.url, headers=get_headers(token, session_id)) as refused:
            assert refused.status == 409
        async with http.get(running.url, headers=get_headers(token, session_id, priming["id"])) as resumed:
            assert resumed.status == 200
            events = sse_events(resumed)
            again = await anext(events)
            missed = [await told(events), await told(events)]
            await change_tools(http, running, token, session_id)
            later = await told(events)
            # The connection taken over was closed: whatever reached it before, nothing after.
            on_lost: list[dict[str, str]] = []
            with contextlib.suppress(aiohttp.ClientPayloadError):
                on_lost += [event async for event in lost_events]
    assert priming == {"id": "0-0", "retry": str(RETRY_MS), "data": ""}
    assert again == {"id": "0-0", "retry": str(RETRY_MS), "data": ""}
    assert [(event["id"], event["method"]) for event in missed + [later]] == [
        ("0-1", LIST_CHANGED), ("0-2", LIST_CHANGED), ("0-3", LIST_CHANGED)]
    assert not {event.get("id") for event in on_lost} - {"0-1", "0-2"}


async def test_a_client_whose_connection_closed_gets_its_stream_again_at_once(daemon: tuple[Daemon, str]) -> None:
    running, token = daemon
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        session_id = await raw_session(http, running.url, token)
        first = await http.get(running.url, headers=get_headers(token, session_id))
        assert first.status == 200
        await anext(sse_events(first))
        assert await stream_open(running, session_id)
        first.close()
        # The gateway writes nothing to a quiet stream for a keep-alive's while, and refused the client (409) until
        # then; now the stream is free as soon as its connection closes.
        while await stream_open(running, session_id):
            pass
        async with http.get(running.url, headers=get_headers(token, session_id)) as second:
            assert second.status == 200
            events = sse_events(second)
            priming = await anext(events)
            await change_tools(http, running, token, session_id)
            heard = await told(events)
    assert priming["data"] == "" and heard["method"] == LIST_CHANGED


async def test_the_sdk_client_hears_what_was_said_while_its_network_was_gone(tmp_path: Path) -> None:
    changed = asyncio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            changed.set()

    tokens = write_config(tmp_path, {"fault": faultsrv_command("--mcp") + '\nprotocol = "mcp"\n'},
                          '[roles.agent]\nallow = ["fault.*"]\n', {"agent": ["agent"]})
    token = tokens["agent"]
    async with asyncio.timeout(TEST_DEADLINE), behind_outage(tmp_path) as (outage, running), http_session() as http:
        async with sdk_client(outage.url, bearer(token), message_handler=on_message) as client:
            await client.list_tools()
            [sdk_session] = [entry["id"] for entry in (await status(running.config_dir))["session_list"]]
            while not await stream_open(running, sdk_session):
                pass  # the SDK opens its GET stream once the session is up
            outage.drop()
            # Said while the client is away, to every session that sees the server: written to the connection the
            # gateway still holds for the SDK's stream.
            await change_tools(http, running, token, await raw_session(http, running.url, token))
            # The SDK reconnects its GET stream after the `retry` its priming event gave, naming the last event it
            # got: it is sent the rest.
            await changed.wait()
            assert (await client.list_tools()).tools
