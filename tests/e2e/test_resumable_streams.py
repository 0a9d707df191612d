"""A 2025 session's streams that lose their connection are taken up again with `Last-Event-ID`, through the real
daemon (gatewayd/resumable.py, web/sse.py, web/mcp_http.py), and with the official SDK's client.

A call's stream (the fault fixture's `progress`: steps a moment apart, then its answer) opens with a priming event
(an id, `retry`, no data) and numbers every event; the client reads one step, drops the connection, and reconnects
with a GET naming the last id it got: it is sent the steps it missed, then the answer, and that response ends. A
stream the client never left is nobody else's to resume. With `sse_poll_after` the gateway ends a long call's
connection itself (SEP-1699 polling) and the client comes back for the rest the same way.

The session's own GET stream (stream 0) does the same for what the session hears outside its calls (here the fault
fixture's `change_tools`: each call makes the child say its tools changed): a client that reconnects is not refused
while the gateway still holds the connection it lost, and one naming the last event it got is sent what it missed.

A network that goes away without a word — the gateway keeps the connection, the client has lost it — is
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
from tests.daemon import Daemon, faultsrv_command, gatewayctl, status, write_config
from tests.e2e.test_mcp_sdk import (
    SESSION_HEADER,
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

CALL_ID: Final = 41
LIST_CHANGED: Final = "notifications/tools/list_changed"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Daemon, str]]:
    root = tmp_path_factory.mktemp("resumable")
    tokens = write_config(root, {"fault": faultsrv_command("--mcp") + '\nprotocol = "mcp"\n'},
                          '[roles.agent]\nallow = ["fault.*"]\n', {"agent": ["agent"]})
    async with Daemon(root) as running:
        yield running, tokens["agent"]


async def session(http: aiohttp.ClientSession, daemon: Daemon, token: str) -> dict[str, str]:
    """A new session's headers, for raw requests."""
    return session_headers(token, await raw_session(http, daemon.url, token))


def progress_call(steps: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": CALL_ID, "method": "tools/call",
            "params": {"name": "fault__progress", "arguments": {"steps": steps, "interval": 0.2, "pause": 0.3},
                       "_meta": {"progressToken": "p"}}}


async def test_a_dropped_call_stream_is_taken_up_again_with_last_event_id(daemon: tuple[Daemon, str]) -> None:
    running, token = daemon
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        headers = await session(http, running, token)
        response = await http.post(running.url, json=progress_call(3), headers=headers)
        assert response.content_type == "text/event-stream"
        first: list[dict[str, Any]] = []
        async for event in sse_events(response):
            first.append(event)
            if "data" in event and event["data"]:
                break  # the first step: then the connection is lost
        response.close()
        stream = first[0]["id"].split("-")[0]
        await running.wait_log(rf"closed before the answer: kept 60s for a reconnection \(stream {stream}\)")
        code, status, err = await gatewayctl(running.config_dir, "status")
        assert code == 0, err
        assert "1 call stream(s) kept for a reconnection" in status
        async with http.get(running.url, headers={**headers, "Accept": "text/event-stream",
                                                  "Last-Event-ID": first[-1]["id"]}) as resumed:
            assert resumed.status == 200
            rest = [event async for event in sse_events(resumed)]  # ends once the answer is sent
    priming, step = first
    assert priming == {"id": f"{stream}-0", "retry": str(RETRY_MS), "data": ""}
    assert step["id"] == f"{stream}-1" and json.loads(step["data"])["params"]["message"].startswith("step 1")
    messages = [json.loads(event["data"]) for event in rest]
    assert [event["id"] for event in rest] == [f"{stream}-{number}" for number in range(2, 2 + len(rest))]
    assert [message["params"]["message"].split()[:2] for message in messages[:2]] == [["step", "2"], ["step", "3"]]
    assert messages[-1]["id"] == CALL_ID and messages[-1]["result"]["structuredContent"] == {"value": {"steps": 3}}


async def test_a_reconnection_takes_the_stream_over_from_a_connection_the_gateway_still_holds(
        daemon: tuple[Daemon, str]) -> None:
    running, token = daemon
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        headers = await session(http, running, token)
        lost = await http.post(running.url, json=progress_call(3), headers=headers)
        first: list[dict[str, Any]] = []
        async for event in sse_events(lost):
            first.append(event)
            if event.get("data"):
                break  # the first step: then this client hears nothing more of the connection, which stays open
        async with http.get(running.url, headers={**headers, "Accept": "text/event-stream",
                                                  "Last-Event-ID": first[-1]["id"]}) as resumed:
            assert resumed.status == 200
            rest = [json.loads(event["data"]) async for event in sse_events(resumed)]  # ends with the answer
        # The connection taken over was closed: whatever reached it before, the answer did not.
        on_lost: list[dict[str, Any]] = []
        with contextlib.suppress(aiohttp.ClientPayloadError):
            on_lost += [json.loads(event["data"]) async for event in sse_events(lost) if event.get("data")]
    assert [message["params"]["message"].split()[1] for message in rest
            if message.get("method") == "notifications/progress"] == ["2", "3"]
    assert rest[-1]["id"] == CALL_ID and rest[-1]["result"]["structuredContent"] == {"value": {"steps": 3}}
    assert not any(message.get("id") == CALL_ID for message in on_lost)


async def test_the_sdk_client_gets_its_answer_after_its_network_went_away_mid_call(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"fault": faultsrv_command("--mcp") + '\nprotocol = "mcp"\n'},
                          '[roles.agent]\nallow = ["fault.*"]\n', {"agent": ["agent"]})
    steps: list[float] = []
    first_step = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)
        first_step.set()

    async with asyncio.timeout(TEST_DEADLINE), behind_outage(tmp_path) as (outage, _), \
            sdk_client(outage.url, bearer(tokens["agent"])) as client:
        call = asyncio.ensure_future(client.call_tool("fault__progress", {"steps": 4, "interval": 0.3},
                                                      progress_callback=on_progress))
        await first_step.wait()
        outage.drop()  # the gateway still holds the call's connection, and writes the next steps to it
        # The SDK reconnects after the `retry` its stream's priming event gave, naming the last event it got.
        result = await call
    assert result.structured_content == {"value": {"steps": 4}}
    assert steps == [1, 2, 3, 4]


async def test_a_stream_whose_connection_held_is_not_resumed(daemon: tuple[Daemon, str]) -> None:
    running, token = daemon
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        headers = await session(http, running, token)
        async with http.post(running.url, json=progress_call(2), headers=headers) as response:
            whole = [event async for event in sse_events(response)]
        # Every event reached the client: nothing of that stream is sent again, and its id opens the session's own
        # stream (stream 0), whose first event after its priming is the next thing the session is told.
        async with http.get(running.url, headers={**headers, "Accept": "text/event-stream",
                                                  "Last-Event-ID": whole[-1]["id"]}) as standalone:
            assert standalone.status == 200
            events = sse_events(standalone)
            priming = await anext(events)
            changed = await mcp_post(http, running.url, token, {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                                                "params": {"name": "fault__change_tools"}},
                                     headers[SESSION_HEADER])
            told = await anext(events)
    assert whole[0]["data"] == "" and json.loads(whole[-1]["data"])["id"] == CALL_ID
    assert priming == {"id": "0-0", "retry": str(RETRY_MS), "data": ""}
    assert changed.status == 200 and told["id"] == "0-1"
    assert json.loads(told["data"])["method"] == "notifications/tools/list_changed"


async def test_with_sse_poll_after_a_long_call_s_connection_ends_and_the_client_comes_back_for_the_rest(
        tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"fault": faultsrv_command("--mcp") + '\nprotocol = "mcp"\n'},
                          '[roles.agent]\nallow = ["fault.*"]\n', {"agent": ["agent"]})
    async with Daemon(tmp_path, "--sse-poll-after", "0.3") as running, asyncio.timeout(TEST_DEADLINE), \
            http_session() as http:
        headers = await session(http, running, tokens["agent"])
        async with http.post(running.url, json=progress_call(4), headers=headers) as response:
            before = [event async for event in sse_events(response)]  # until the gateway ends the connection
        async with http.get(running.url, headers={**headers, "Accept": "text/event-stream",
                                                  "Last-Event-ID": before[-1]["id"]}) as resumed:
            after = [event async for event in sse_events(resumed)]
    first = [json.loads(event["data"]) for event in before if event.get("data")]
    rest = [json.loads(event["data"]) for event in after if event.get("data")]
    assert not any(message.get("id") == CALL_ID for message in first), "the connection ended before the answer"
    assert [message["params"]["message"].split()[1] for message in first + rest
            if message.get("method") == "notifications/progress"] == ["1", "2", "3", "4"]
    assert rest[-1]["id"] == CALL_ID and "result" in rest[-1]


# -- the session's own GET stream --------------------------------------------------------------------------------------


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
