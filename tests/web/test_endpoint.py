"""The /mcp endpoint's HTTP rules: auth, Host/Origin, framing, limits, MCP sessions, SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd.state import DaemonState
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, dechunked, running_stack
from tests.waiting import eventually

Client = LocalClient
SSE = "application/json, text/event-stream"
# A client that takes an event stream only: its answers are SSE even when they are ready at once.
SSE_ONLY = "text/event-stream"
# Progress notifications sent this far apart (seconds), this many: each read on its own by the gateway.
SPACING = 0.01
SPACED_STEPS = 20
# A client that stops reading its stream: this many progress notifications of about this many bytes each, past what
# its connection holds and the gateway queues for it (sse.QUEUE_LIMIT), with a receive buffer this small.
FLOOD_STEPS = 6000
FLOOD_PAD = 4096
SLOW_RCVBUF = 4096
CALC = python_command("-m", "gatewayd.examples.calc") + """
protocol = "jsonrpc"
[methods.add]
description = "Add two numbers"
input_schema = { type = "object", properties = { a = { type = "number" }, b = { type = "number" } } }
[methods.divide]
[methods.log]
notification = true
"""
def fault(record: Path) -> str:
    """The MCP fault fixture, recording every line it receives."""
    return python_command(str(FAULTSRV), "--mcp", "--record", str(record))
ROLES = """
[roles.calc]
allow = ["calc.*"]
[roles.fault]
allow = ["fault.*"]
[roles.confirm]
confirm = ["calc.divide"]
[roles.confirm.confirmation."calc.*"]
timeout = "50ms"
"""


class Stack:
    """An in-process gateway with two clients: `full` (calc + fault) and `calc_only`."""

    def __init__(self, client: Client, state: DaemonState, tokens: dict[str, str], record: Path) -> None:
        self.record = record
        self.client = client
        self.state = state
        self.tokens = tokens

    def headers(self, who: str = "full", **extra: str) -> dict[str, str]:
        return headers(self.tokens[who], **extra)

    async def post(self, body: Any, who: str = "full", **extra: str) -> Any:
        return await self.client.post("/mcp", data=json.dumps(body), headers=self.headers(who, **extra))

    async def initialize(self, who: str = "full", version: str = "2025-11-25") -> str:
        response = await self.post(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            who, Accept=SSE,
        )
        assert response.status == 200
        session: str = response.headers["Mcp-Session-Id"]
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, who,
                        **{"Mcp-Session-Id": session, "MCP-Protocol-Version": version})
        return session


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    tokens = write_config(
        tmp_path, {"calc": CALC, "fault": fault(tmp_path / "fault.jsonl")}, ROLES,
        {"full": ["calc", "fault", "confirm"], "calc_only": ["calc"]},
    )
    async with running_stack(tmp_path, sse_keepalive=0.2) as (client, state):
        yield Stack(client, state, tokens, tmp_path / "fault.jsonl")


def call(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, **({"params": params} if params is not None else {})}


async def answer_of(response: Any) -> Any:
    """The JSON-RPC answer of a response, sent as JSON or, when the client accepts it, as SSE (its last event)."""
    if response.content_type == "text/event-stream":
        return sse_events(await response.text())[-1]
    return await response.json()


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON of every `data:` line; each must be a whole message on one line."""
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


# -- auth and transport guard -------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic abc", "Bearer", "bearer  "])
async def test_missing_or_wrong_token_is_401_with_challenge(stack: Stack, authorization: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = await stack.client.post("/mcp", data=json.dumps(call("calc.add", {"a": 1, "b": 2})), headers=headers)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_token_scheme_is_case_insensitive(stack: Stack) -> None:
    headers = stack.headers()
    headers["Authorization"] = headers["Authorization"].replace("Bearer", "bearer")
    response = await stack.client.post("/mcp", data=json.dumps(call("calc.add", {"a": 1, "b": 2})), headers=headers)
    assert (await response.json())["result"] == 3


async def test_foreign_host_is_421(stack: Stack) -> None:
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}), Host="evil.example.com")
    assert response.status == 421


async def test_foreign_origin_is_403_and_own_origin_is_fine(stack: Stack) -> None:
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}), Origin="https://evil.example.com")
    assert response.status == 403
    own = f"http://127.0.0.1:{stack.client.port}"
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}), Origin=own)
    assert response.status == 200


async def test_body_over_the_limit_is_413(stack: Stack) -> None:
    limit = stack.state.settings.max_body_bytes
    padding = "x" * limit
    response = await stack.post(call("calc.add", {"a": 1, "b": 2, "pad": padding}))
    assert response.status == 413
    # The daemon keeps serving.
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}))
    assert (await response.json())["result"] == 3


async def test_a_body_sent_in_chunks_is_read_whole_and_its_limit_kept(stack: Stack) -> None:
    # No Content-Length: read through aiohttp as it arrives, not taken as it lies (mcp_http.handle_post).
    async def chunks(body: bytes) -> AsyncIterator[bytes]:
        half = len(body) // 2
        yield body[:half]
        yield body[half:]

    headers = {**stack.headers(), "Content-Type": "application/json"}
    body = json.dumps(call("calc.add", {"a": 1, "b": 2})).encode()
    response = await stack.client.post("/mcp", data=chunks(body), headers=headers)
    assert response.headers.get("Content-Length") is not None and (await response.json())["result"] == 3
    padding = "x" * stack.state.settings.max_body_bytes
    large = json.dumps(call("calc.add", {"a": 1, "b": 2, "pad": padding})).encode()
    response = await stack.client.post("/mcp", data=chunks(large), headers=headers)
    assert response.status == 413


async def test_wrong_content_type_is_415(stack: Stack) -> None:
    headers = {**stack.headers(), "Content-Type": "text/plain"}
    response = await stack.client.post("/mcp", data=json.dumps(call("calc.add")), headers=headers)
    assert response.status == 415


async def test_accept_without_json_or_sse_is_406(stack: Stack) -> None:
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}), Accept="text/html")
    assert response.status == 406


# -- direct calls and policy -------------------------------------------------------------------


async def test_direct_calls_need_no_session(stack: Stack) -> None:
    response = await stack.post(call("calc.add", {"a": 2, "b": 40}))
    assert response.status == 200 and (await response.json())["result"] == 42


async def test_denied_method_looks_exactly_like_an_unknown_one(stack: Stack) -> None:
    denied = await (await stack.post(call("fault.echo", {"x": 1}), who="calc_only")).json()
    unknown = await (await stack.post(call("nosuch.echo", {"x": 1}), who="calc_only")).json()
    missing = await (await stack.post(call("calc.nosuch", {}), who="calc_only")).json()
    assert denied == unknown == missing == {"jsonrpc": "2.0", "id": 1,
                                            "error": {"code": -32601, "message": "Method not found"}}


async def test_tool_servers_own_errors_pass_through_on_direct_calls(stack: Stack) -> None:
    body = await (await stack.post(call("calc.divide", {"a": 1, "b": 0}))).json()
    assert body["error"]["code"] == -32016  # calc.divide is confirm-gated for `full`; nobody confirms
    body = await (await stack.post(call("calc.divide", {"a": 1, "b": 0}), who="calc_only")).json()
    assert body["error"] == {"code": -32000, "message": "division by zero"}


async def test_client_ids_are_restored_whatever_their_type(stack: Stack) -> None:
    batch = [call("calc.add", {"a": i, "b": 0}, id=ident) for i, ident in enumerate(["7", 7, "x" * 100, None])]
    body = await (await stack.post(batch)).json()
    assert sorted((json.dumps(r["id"]), r["result"]) for r in body) == sorted(
        (json.dumps(ident), i) for i, ident in enumerate(["7", 7, "x" * 100, None]))


# -- MCP sessions ------------------------------------------------------------------------------


async def test_initialize_negotiates_the_version(stack: Stack) -> None:
    for asked, answered in [("2025-11-25", "2025-11-25"), ("2025-03-26", "2025-03-26"), ("1999-01-01", "2025-11-25")]:
        response = await stack.post(call("initialize", {"protocolVersion": asked, "capabilities": {},
                                                        "clientInfo": {"name": "t", "version": "1"}}), Accept=SSE)
        body = await answer_of(response)
        assert body["result"]["protocolVersion"] == answered
        assert body["result"]["capabilities"]["tools"] == {"listChanged": True}
        session = response.headers["Mcp-Session-Id"]
        assert len(session) >= 32 and all(0x21 <= ord(c) <= 0x7E for c in session)


async def test_mcp_methods_need_a_session(stack: Stack) -> None:
    response = await stack.post(call("tools/list"), Accept=SSE)
    assert response.status == 400


async def test_unknown_deleted_or_foreign_session_is_404(stack: Stack) -> None:
    response = await stack.post(call("tools/list"), Accept=SSE, **{"Mcp-Session-Id": "nope"})
    assert response.status == 404
    session = await stack.initialize()
    foreign = await stack.post(call("tools/list"), who="calc_only", Accept=SSE, **{"Mcp-Session-Id": session})
    assert foreign.status == 404
    deleted = await stack.client.delete("/mcp", headers=stack.headers(**{"Mcp-Session-Id": session}))
    assert deleted.status == 204
    response = await stack.post(call("tools/list"), Accept=SSE, **{"Mcp-Session-Id": session})
    assert response.status == 404


async def test_unsupported_protocol_version_header_is_400(stack: Stack) -> None:
    session = await stack.initialize()
    response = await stack.post(call("ping"), Accept=SSE,
                                **{"Mcp-Session-Id": session, "MCP-Protocol-Version": "1999-01-01"})
    assert response.status == 400


async def test_ping(stack: Stack) -> None:
    session = await stack.initialize()
    response = await stack.post(call("ping"), Accept=SSE, **{"Mcp-Session-Id": session})
    assert (await answer_of(response)) == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_tools_list_shows_what_the_client_may_call_in_order(stack: Stack) -> None:
    session = await stack.initialize(who="calc_only")
    response = await stack.post(call("tools/list"), who="calc_only", Accept=SSE, **{"Mcp-Session-Id": session})
    tools = (await answer_of(response))["result"]["tools"]
    assert [t["name"] for t in tools] == ["calc__add", "calc__divide", "calc__log"]
    assert tools[0]["inputSchema"] == {"type": "object", "properties": {"a": {"type": "number"},
                                                                        "b": {"type": "number"}}}
    assert tools[0]["description"] == "Add two numbers"


async def test_tools_list_passes_mcp_schemas_through_verbatim(stack: Stack) -> None:
    session = await stack.initialize()
    response = await stack.post(call("tools/list"), Accept=SSE, **{"Mcp-Session-Id": session})
    names = [t["name"] for t in (await answer_of(response))["result"]["tools"]]
    assert names == sorted(names) and "fault__echo" in names and "calc__add" in names


async def test_tools_call_with_json_answer(stack: Stack) -> None:
    session = await stack.initialize()
    response = await stack.post(call("tools/call", {"name": "calc__add", "arguments": {"a": 1, "b": 2}}),
                                **{"Mcp-Session-Id": session})
    assert response.content_type == "application/json"
    result = (await response.json())["result"]
    assert result == {"content": [{"type": "text", "text": "3"}], "structuredContent": {"result": 3},
                      "isError": False}


async def test_tool_failure_is_an_is_error_result(stack: Stack) -> None:
    session = await stack.initialize(who="calc_only")
    response = await stack.post(call("tools/call", {"name": "calc__divide", "arguments": {"a": 1, "b": 0}}),
                                who="calc_only", **{"Mcp-Session-Id": session})
    result = (await response.json())["result"]
    assert result["isError"] is True and "division by zero" in result["content"][0]["text"]


async def test_unknown_and_denied_tools_answer_the_same(stack: Stack) -> None:
    session = await stack.initialize(who="calc_only")
    answers = []
    for name in ("fault__echo", "nosuch__tool", "calc__nosuch", "calc.add"):
        response = await stack.post(call("tools/call", {"name": name, "arguments": {}}), who="calc_only",
                                    **{"Mcp-Session-Id": session})
        answers.append((await response.json())["error"])
    assert all(a == {"code": -32602, "message": f"Unknown tool: {n}"} for a, n in
               zip(answers, ("fault__echo", "nosuch__tool", "calc__nosuch", "calc.add"), strict=True))


async def test_tools_call_streams_progress_then_the_result_over_sse(stack: Stack) -> None:
    session = await stack.initialize()
    params = {"name": "fault__progress", "arguments": {"steps": 3}, "_meta": {"progressToken": "tok-1"}}
    response = await stack.post(call("tools/call", params, id=9), Accept=SSE, **{"Mcp-Session-Id": session})
    assert response.content_type == "text/event-stream"
    text = await response.text()
    events = sse_events(text)
    progress = [e["params"] for e in events if e.get("method") == "notifications/progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert {p["progressToken"] for p in progress} == {"tok-1"}
    assert any(e.get("method") == "notifications/message" for e in events)
    assert events[-1]["id"] == 9 and events[-1]["result"]["structuredContent"] == {"value": {"steps": 3}}


async def test_notifications_arriving_one_by_one_on_an_open_stream_all_arrive_in_order(stack: Stack) -> None:
    # Spaced out, each finds the stream open and its writer waiting: written as it is read (sse.CallStream.emit).
    session = await stack.initialize()
    params = {"name": "fault__progress", "arguments": {"steps": SPACED_STEPS, "interval": SPACING},
              "_meta": {"progressToken": "tok-2"}}
    response = await stack.post(call("tools/call", params, id=10), Accept=SSE, **{"Mcp-Session-Id": session})
    assert response.content_type == "text/event-stream"
    events = sse_events(await response.text())
    progress = [e["params"]["progress"] for e in events if e.get("method") == "notifications/progress"]
    assert progress == list(range(1, SPACED_STEPS + 1))
    assert events[-1]["id"] == 10 and events[-1]["result"]["structuredContent"] == {"value": {"steps": SPACED_STEPS}}


@pytest.mark.parametrize("interval", [0.0, SPACING], ids=["queued", "written-at-once"])
async def test_a_notification_that_cannot_be_encoded_is_dropped_and_the_call_goes_on(
        stack: Stack, caplog: Any, interval: float) -> None:
    # A child may escape a lone surrogate (`\ud800`): valid JSON that has no UTF-8 form to send on. Bunched, the
    # notifications wait for the stream's task; spaced, each is written as it is read: either way that one is left out.
    caplog.set_level(logging.WARNING, logger="gatewayd.web.sse")
    session = await stack.initialize()
    params = {"name": "fault__progress", "arguments": {"steps": 5, "interval": interval, "unsendable": 3},
              "_meta": {"progressToken": "odd"}}
    response = await stack.post(call("tools/call", params, id=12), Accept=SSE, **{"Mcp-Session-Id": session})
    assert response.content_type == "text/event-stream"
    events = sse_events(await response.text())
    assert [e["params"]["progress"] for e in events if e.get("method") == "notifications/progress"] == [1, 2, 4, 5]
    assert events[-1]["id"] == 12 and events[-1]["result"]["structuredContent"] == {"value": {"steps": 5}}
    await eventually(lambda: "1 notifications not sent: not encodable" in caplog.text, what="the drop was logged")


async def test_a_client_that_stops_reading_its_stream_loses_notifications_past_the_queue_but_not_the_answer(
        stack: Stack, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="gatewayd.web.sse")
    session = await stack.initialize()
    params = {"name": "fault__progress", "arguments": {"steps": FLOOD_STEPS, "pad": FLOOD_PAD},
              "_meta": {"progressToken": "slow"}}
    body = json.dumps(call("tools/call", params, id=11)).encode()
    head = {**stack.headers(), "Accept": SSE, "Mcp-Session-Id": session, "Host": f"127.0.0.1:{stack.client.port}",
            "Content-Length": str(len(body))}
    # A client with a small receive window that reads nothing until the call is over.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", stack.client.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=FLOOD_STEPS * FLOOD_PAD * 2)
    try:
        writer.write(b"POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
                     + b"\r\n" + body)
        await eventually(lambda: stack.record.exists() and "tools/call" in stack.record.read_text(),
                         what="the call reached its server")
        await eventually(lambda: len(stack.state.inflight) == 0, what="the server answered the call")
        async with asyncio.timeout(30):
            raw = await reader.readuntil(b"\r\n0\r\n\r\n")
    finally:
        writer.close()
    events = sse_events(dechunked(raw.partition(b"\r\n\r\n")[2]).decode())
    progress = [e["params"]["progress"] for e in events if e.get("method") == "notifications/progress"]
    notifications = sum(1 for e in events if "method" in e)
    assert progress == sorted(set(progress)) and progress[0] == 1  # in order, none twice
    assert events[-1]["id"] == 11 and events[-1]["result"]["structuredContent"] == {"value": {"steps": FLOOD_STEPS}}
    await eventually(lambda: "slow SSE reader" in caplog.text, what="the gateway said what it dropped")
    dropped = int(caplog.text.split("slow SSE reader: ")[1].split(" ")[0])
    assert dropped > 0 and notifications + dropped == FLOOD_STEPS + 1  # the progress and the log message


async def test_long_calls_get_keepalive_comments(stack: Stack) -> None:
    session = await stack.initialize()
    params = {"name": "fault__sleep", "arguments": {"seconds": 0.7}}
    response = await stack.post(call("tools/call", params), Accept=SSE, **{"Mcp-Session-Id": session})
    text = await response.text()
    assert ": keep-alive" in text
    assert sse_events(text)[-1]["result"]["structuredContent"] == {"value": {"slept": 0.7}}


async def test_a_stream_silent_after_its_notifications_gets_keepalive_comments_until_the_result(
        stack: Stack) -> None:
    session = await stack.initialize()
    params = {"name": "fault__progress", "arguments": {"steps": 2, "pause": 0.7}, "_meta": {"progressToken": "t"}}
    response = await stack.post(call("tools/call", params, id=4), Accept=SSE, **{"Mcp-Session-Id": session})
    text = await response.text()
    after_progress = text[text.rindex("notifications/progress"):]
    assert ": keep-alive" in after_progress.split('"id":4')[0]
    assert sse_events(text)[-1]["result"]["structuredContent"] == {"value": {"steps": 2}}


async def test_sse_data_lines_stay_single_line_for_multiline_results(stack: Stack) -> None:
    session = await stack.initialize()
    params = {"name": "fault__echo", "arguments": {"text": "line 1\nline 2\n\ndata: fake"}}
    response = await stack.post(call("tools/call", params), Accept=SSE_ONLY, **{"Mcp-Session-Id": session})
    assert response.content_type == "text/event-stream"
    events = sse_events(await response.text())
    assert events[-1]["result"]["structuredContent"]["value"] == {"text": "line 1\nline 2\n\ndata: fake"}


async def test_notifications_and_responses_get_202(stack: Stack) -> None:
    session = await stack.initialize()
    response = await stack.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                                **{"Mcp-Session-Id": session})
    assert response.status == 202 and await response.text() == ""
    response = await stack.post({"jsonrpc": "2.0", "id": 5, "result": {}}, **{"Mcp-Session-Id": session})
    assert response.status == 202


async def test_get_stream_carries_tools_list_changed(stack: Stack) -> None:
    session = await stack.initialize()
    stream = await stack.client.get("/mcp", headers=stack.headers(Accept="text/event-stream",
                                                                  **{"Mcp-Session-Id": session}))
    assert stream.status == 200 and stream.content_type == "text/event-stream"
    second = await stack.client.get("/mcp", headers=stack.headers(Accept="text/event-stream",
                                                                  **{"Mcp-Session-Id": session}))
    assert second.status == 409
    outsider = await stack.initialize(who="calc_only")
    await stack.post(call("fault.change_tools", {}))
    async with asyncio.timeout(10):
        while True:
            line = (await stream.content.readline()).decode()
            if line.startswith("data: "):
                assert json.loads(line[6:]) == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
                break
    stream.close()
    # The broadcast is one synchronous pass: a client that can see nothing on `fault` was left out of it.
    outsider_session = stack.state.sessions.get(outsider, "calc_only")
    assert outsider_session is not None and outsider_session.outbound.empty()


async def test_client_cancellation_stops_the_call(stack: Stack) -> None:
    session = await stack.initialize()
    headers = {"Mcp-Session-Id": session}
    slow = asyncio.ensure_future(stack.post(call("tools/call", {"name": "fault__sleep", "arguments": {"seconds": 30}},
                                                 id="slow-1"), **headers))
    inflight = stack.state.inflight
    await eventually(lambda: bool(inflight), what="call in flight")
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow-1"}}
    assert (await stack.post(cancel, **headers)).status == 202
    async with asyncio.timeout(10):
        body = await (await slow).json()
    assert body["error"]["code"] == -32017

    def received() -> list[dict[str, Any]]:
        return [json.loads(line) for line in stack.record.read_text().splitlines()]

    await eventually(lambda: any(m.get("method") == "notifications/cancelled" for m in received()),
                     what="the child got notifications/cancelled")
    upstream_call = next(m for m in received() if m.get("method") == "tools/call")
    cancelled = next(m for m in received() if m.get("method") == "notifications/cancelled")
    assert cancelled["params"]["requestId"] == upstream_call["id"] != "slow-1"


async def test_notification_to_an_mcp_tool_is_not_run(stack: Stack) -> None:
    response = await stack.post({"jsonrpc": "2.0", "method": "fault.echo", "params": {"x": 1}})
    assert response.status == 202
    await stack.post(call("fault.pid", {}))
    methods = [json.loads(line).get("method") for line in stack.record.read_text().splitlines()]
    assert methods.count("tools/call") == 1


async def test_a_quick_call_is_one_json_body_or_for_an_sse_only_client_the_whole_stream_in_one_body(
        stack: Stack) -> None:
    session = await stack.initialize()
    add = call("tools/call", {"name": "calc__add", "arguments": {"a": 1, "b": 2}})
    plain = await stack.post(add, Accept=SSE, **{"Mcp-Session-Id": session})
    assert plain.content_type == "application/json" and plain.headers["Mcp-Session-Id"] == session
    assert plain.headers["Content-Length"] == str(len(await plain.read()))
    assert (await plain.json())["result"]["structuredContent"] == {"result": 3}
    streamed = await stack.post(add, Accept=SSE_ONLY, **{"Mcp-Session-Id": session})
    assert streamed.content_type == "text/event-stream" and streamed.headers["Mcp-Session-Id"] == session
    assert streamed.headers["Content-Length"] == str(len(await streamed.read()))
    assert sse_events(await streamed.text())[-1]["result"]["structuredContent"] == {"result": 3}


async def test_a_dropped_sse_stream_does_not_stop_the_call_or_the_daemon(stack: Stack, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.web.sse")
    session = await stack.initialize()
    params = {"name": "fault__sleep", "arguments": {"seconds": 0.5}}
    response = await stack.post(call("tools/call", params), Accept=SSE, **{"Mcp-Session-Id": session})
    async with asyncio.timeout(10):
        # Its priming event first (an id and `retry`: resumable.py), then a keep-alive while the call runs.
        assert (await response.content.readline()).startswith(b"id: ")
        while not (await response.content.readline()).startswith(b": keep-alive"):
            pass
    response.close()
    await eventually(lambda: "SSE stream closed before the answer" in caplog.text, what="the gateway noticed")
    answer = await stack.post(call("calc.add", {"a": 1, "b": 1}))
    assert (await answer.json())["result"] == 2


async def test_hostile_bodies_get_clear_errors_and_the_daemon_keeps_serving(stack: Stack) -> None:
    headers = stack.headers()
    deep = b'{"jsonrpc":"2.0","id":1,"method":"calc.add","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for body, code in [(deep, -32600), (b'{"jsonrpc":"2.0","id":1,"method":"calc.add","params":[NaN]}', -32700),
                       (b"9" * 100_000, -32700), (b"\xff\xfe{}", -32700)]:
        response = await stack.client.post("/mcp", data=body, headers=headers)
        assert response.status == 400
        answer = await response.json()
        assert answer["error"]["code"] == code and answer["id"] is None
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}))
    assert (await response.json())["result"] == 3


@pytest.mark.parametrize("params", [["calc__add", {}], {"name": "calc__add", "arguments": "a=1"},
                                    {"name": 7, "arguments": {}}, {"arguments": {}}])
async def test_tools_call_with_params_of_the_wrong_type(stack: Stack, params: Any) -> None:
    session = await stack.initialize()
    response = await stack.post(call("tools/call", params), **{"Mcp-Session-Id": session})
    assert (await response.json())["error"]["code"] == -32602


async def test_a_bug_answers_internal_error_without_details(stack: Stack, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: Any) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail of a bug")

    monkeypatch.setattr("gatewayd.upstream.server.ToolServer.call_method", broken)
    response = await stack.post(call("calc.add", {"a": 1, "b": 2}))
    assert response.status == 200
    assert await response.json() == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "Internal error"}}
    assert "secret detail of a bug" in caplog.text  # in the daemon's log, never on the wire


@pytest.mark.parametrize("method", ["ping", "tools/list", "logging/setLevel"])
async def test_an_answer_ready_at_once_is_json_unless_the_client_takes_only_sse(stack: Stack, method: str) -> None:
    session = await stack.initialize()
    params = {"level": "info"} if method == "logging/setLevel" else None
    answers = []
    for accept, kind in ((SSE, "application/json"), ("application/json", "application/json"),
                         (SSE_ONLY, "text/event-stream")):
        response = await stack.post(call(method, params), Accept=accept, **{"Mcp-Session-Id": session})
        assert response.content_type == kind
        # Ready at once: one body with a length, not a held-open stream.
        assert response.headers.get("Content-Length") is not None
        answers.append(await answer_of(response))
    assert answers[0] == answers[1] == answers[2]


async def test_tools_list_follows_a_changed_tool_list_though_listings_are_remembered(stack: Stack) -> None:
    sessions = {who: await stack.initialize(who) for who in ("full", "calc_only")}

    async def names(who: str) -> set[str]:
        answer = await answer_of(await stack.post(call("tools/list", {}), who, Accept=SSE,
                                                  **{"Mcp-Session-Id": sessions[who]}))
        return {tool["name"] for tool in answer["result"]["tools"]}

    before = await names("full")
    assert "fault__extra" not in before and await names("full") == before  # the second is the remembered one
    calc_only = await names("calc_only")
    await stack.post(call("fault.change_tools", {}))
    # The child sends list_changed before its reply, so the server has forgotten its old list by now: the next
    # listing is made again and shows the new tool.
    assert await names("full") == before | {"fault__extra"} and await names("calc_only") == calc_only
