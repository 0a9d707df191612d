"""Answers carrying a large string are written in slices, byte for byte what the plain encoding gives.

The slicing is unit-tested against `jsonrpc.dumps` on both sides of LARGE_STRING (escapes, characters of every
UTF-8 length, keys that are not strings, nesting); the written body lets go of its answer; and a few MiB go
through a running gateway as JSON (chunked) and as an SSE event, intact. The other way, a large argument goes to
its child on a line made from its bytes (tests/upstream/test_writes.py has the line itself), on each route.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd import jsonrpc, jsontext
from gatewayd.web import bodies
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, running_stack

# Every kind of character the escaping treats differently, and one of each UTF-8 length.
MIXED = 'ab"\\\n\t\x01é\u2028€\U0001f600<'
# Characters of every UTF-8 length that JSON leaves as they are (DEL and U+2028 included): a slice of these is
# written as its UTF-8 bytes without escaping.
PLAIN = "aé\u2028€\U0001f600\x7f<"
BIG = jsontext.LARGE_STRING + 1
HUGE_ANSWER = 3 * 1024 * 1024 + 17
MODERN = "2026-07-28"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "bodies-test", "version": "1"}}


def text_of(size: int) -> str:
    return (MIXED * (size // len(MIXED) + 1))[:size]


def written(message: Any) -> bytes:
    return b"".join(bodies._encoded(message))


@pytest.mark.parametrize("size", [jsontext.LARGE_STRING, BIG, 2 * bodies.LARGE_SLICE + 3])
def test_a_sliced_answer_is_the_plain_encoding(size: int) -> None:
    text = text_of(size)
    for message in (
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}], "isError": False}},
        {"a": [text, {"k": text}], 1: "x", None: text, 2.5: [1.5, None, True], "z": {}},
        [text, [], {}],
        {"jsonrpc": "2.0", "id": "s", "result": text},
    ):
        assert written(message) == jsonrpc.dumps(message)
        assert jsontext.carries_large_string(message) is (size > jsontext.LARGE_STRING)


@pytest.mark.parametrize("where", [0, bodies.LARGE_SLICE - 1, bodies.LARGE_SLICE, 2 * bodies.LARGE_SLICE + 2])
def test_slices_with_nothing_to_escape_and_one_with_something_are_the_plain_encoding(where: int) -> None:
    plain = (PLAIN * ((2 * bodies.LARGE_SLICE + 3) // len(PLAIN) + 1))[:2 * bodies.LARGE_SLICE + 3]
    for escaped in ('"', "\\", "\x1f", "\n"):
        text = plain[:where] + escaped + plain[where + 1:]
        message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}
        assert written(message) == jsonrpc.dumps(message)
    assert written([plain]) == jsonrpc.dumps([plain])


def test_a_lone_surrogate_in_a_large_string_is_refused_as_the_plain_encoding_refuses_it() -> None:
    text = "x" * BIG + "\ud800"
    for encode in (jsonrpc.dumps, written):
        with pytest.raises(UnicodeEncodeError):
            encode({"text": text})


def test_small_answers_are_one_bytes_object_and_large_ones_a_stream() -> None:
    small = {"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * jsontext.LARGE_STRING}}
    assert bodies.json_body(small) == jsonrpc.dumps(small)
    assert bodies.sse_body(small) == bodies.SSE_HEAD + jsonrpc.dumps(small) + bodies.SSE_TAIL
    large = {"jsonrpc": "2.0", "id": 1, "result": {"text": "x" * BIG}}
    assert not isinstance(bodies.json_body(large), bytes)
    # A large string past what is looked through is encoded whole: the same text, the plain way.
    buried = {"jsonrpc": "2.0", "id": 1, "result": [list(range(jsontext.SCAN_VALUES)), "x" * BIG]}
    assert bodies.json_body(buried) == jsonrpc.dumps(buried)


def test_a_non_finite_number_beside_a_large_string_is_refused_as_the_plain_encoding_refuses_it() -> None:
    with pytest.raises(ValueError):
        written({"text": "x" * BIG, "n": float("nan")})


class Collect:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    async def write(self, part: bytes) -> None:
        self.parts.append(bytes(part))


async def test_a_written_body_lets_go_of_its_answer() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "result": {"text": text_of(BIG)}}
    body = bodies.sse_body(message)
    assert not isinstance(body, bytes)
    assert body.decode() == (bodies.SSE_HEAD + jsonrpc.dumps(message) + bodies.SSE_TAIL).decode()
    sink = Collect()
    await body.write(sink)  # type: ignore[arg-type]
    assert b"".join(sink.parts) == bodies.SSE_HEAD + jsonrpc.dumps(message) + bodies.SSE_TAIL
    assert max(map(len, sink.parts)) < 2 * bodies.LARGE_SLICE * 4  # slices, never the whole
    with pytest.raises(RuntimeError):
        await body.write(sink)  # type: ignore[arg-type]


# -- through the gateway ---------------------------------------------------------------------------

SPY = """
protocol = "jsonrpc"
[methods.huge]
[methods.echo]
"""


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[LocalClient, str]]:
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + SPY, "mcp": python_command(
        str(FAULTSRV), "--mcp")}, '[roles.r]\nallow = ["spy.*", "mcp.*"]\n', {"c": ["r"]})
    async with running_stack(tmp_path) as (client, _state):
        yield client, tokens["c"]


async def session_of(client: LocalClient, token: str) -> dict[str, str]:
    """The headers of a new 2025-11-25 session's requests."""
    opened = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}}}
    response = await client.post("/mcp", data=json.dumps(opened), headers=headers(
        token, Accept="application/json, text/event-stream"))
    return {"Mcp-Session-Id": response.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}


async def test_a_large_result_goes_through_whole_as_json_and_as_an_event(gateway: tuple[LocalClient, str]) -> None:
    client, token = gateway
    call = {"jsonrpc": "2.0", "id": 7, "method": "spy.huge", "params": {"size": HUGE_ANSWER}}
    response = await client.post("/mcp", data=json.dumps(call), headers=headers(token, Accept="application/json"))
    assert response.status == 200 and response.headers.get("Transfer-Encoding") == "chunked"
    assert await response.json() == {"jsonrpc": "2.0", "id": 7, "result": "x" * HUGE_ANSWER}
    tool = {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "mcp__huge",
                                                                          "arguments": {"size": HUGE_ANSWER}}}
    # A client that takes an event stream only gets even an answer ready at once as an event.
    response = await client.post("/mcp", data=json.dumps(tool), headers=headers(
        token, Accept="text/event-stream", **await session_of(client, token)))
    assert response.status == 200 and response.content_type == "text/event-stream"
    text = await response.text()
    assert text.startswith("event: message\ndata: ") and text.endswith("\n\n")
    answer = json.loads(text.removeprefix("event: message\ndata: "))
    assert answer["id"] == 8 and answer["result"]["structuredContent"] == {"value": "x" * HUGE_ANSWER}


async def test_a_large_argument_reaches_its_child_intact_on_a_line_made_from_its_bytes(
        gateway: tuple[LocalClient, str], monkeypatch: pytest.MonkeyPatch) -> None:
    client, token = gateway
    made: list[str] = []
    parts = jsontext.parts

    def watched(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, dict) and "method" in value:  # a line to a child, not an answer or an audit hash
            made.append(value["method"])
        return parts(value, *args, **kwargs)

    monkeypatch.setattr(jsontext, "parts", watched)
    text = text_of(BIG)
    direct = {"jsonrpc": "2.0", "id": 1, "method": "spy.echo", "params": {"text": text}}
    response = await client.post("/mcp", data=json.dumps(direct), headers=headers(token, Accept="application/json"))
    assert response.status == 200, await response.text()
    assert await response.json() == {"jsonrpc": "2.0", "id": 1, "result": {"text": text}}
    tool = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "mcp__echo",
                                                                          "arguments": {"text": text}}}
    response = await client.post("/mcp", data=json.dumps(tool), headers=headers(
        token, Accept="application/json", **await session_of(client, token)))
    assert (await response.json())["result"]["structuredContent"] == {"value": {"text": text}}
    stateless = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "mcp__echo", "arguments": {"text": text}, "_meta": MODERN_META}}
    response = await client.post("/mcp", data=json.dumps(stateless), headers=headers(
        token, Accept="application/json", **{"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call",
                                             "Mcp-Name": "mcp__echo"}))
    assert (await response.json())["result"]["structuredContent"] == {"value": {"text": text}}
    assert made == ["echo", "tools/call", "tools/call"]
    # A small argument's line is made the plain way.
    small = {"jsonrpc": "2.0", "id": 4, "method": "spy.echo", "params": {"text": text[:100]}}
    response = await client.post("/mcp", data=json.dumps(small), headers=headers(token, Accept="application/json"))
    assert await response.json() == {"jsonrpc": "2.0", "id": 4, "result": {"text": text[:100]}}
    assert made == ["echo", "tools/call", "tools/call"]
