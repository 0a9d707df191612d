"""A child answering with a number JSON cannot carry (1e400, NaN, Infinity): the call fails at once, not at its
timeout, and the child goes on serving; the line is never turned into an `inf` to forward."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from gatewayd.errors import ToolServerUnavailable
from gatewayd.upstream.peer import NonFinite, decode_line, parse_text
from gatewayd.upstream.server import ToolServer
from tests.upstream.test_supervision import FAULT_METHODS, fault_server, servers, track  # noqa: F401 (fixture)

LITERALS = ("1e400", "-1e400", "NaN", "Infinity", "-Infinity")
# The call's own timeout, far longer than the failure may take.
CALL_TIMEOUT = "60s"
FAST = 10.0


@pytest.mark.parametrize("literal", LITERALS)
async def test_a_non_finite_answer_fails_its_call_at_once(
    tmp_path: Path, servers: list[ToolServer], literal: str, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    caplog.set_level(logging.WARNING, logger="gatewayd.upstream.peer")
    methods = {**FAULT_METHODS, "nonfinite": {}}
    server = track(servers, fault_server(tmp_path, methods=methods, call_timeout=CALL_TIMEOUT))
    pid = await server.call_method("pid", {})
    started = time.monotonic()
    with pytest.raises(ToolServerUnavailable) as failed:
        await server.call_method("nonfinite", {"literal": literal})
    assert time.monotonic() - started < FAST
    wire = failed.value.to_wire()
    assert wire["code"] == -32011 and wire["data"]["retryable"] is False
    assert "answered nonfinite with a number JSON cannot carry" in wire["message"]
    assert "answered nonfinite with a number JSON cannot carry: '{" in caplog.text and literal in caplog.text
    # Only that answer was bad: the same child serves the next call.
    assert await server.call_method("echo", {"n": 1}) == {"n": 1} and server.pid == pid


async def test_over_mcp_too(tmp_path: Path, servers: list[ToolServer]) -> None:  # noqa: F811
    server = track(servers, fault_server(tmp_path, "--mcp", call_timeout=CALL_TIMEOUT))
    started = time.monotonic()
    with pytest.raises(ToolServerUnavailable, match="a number JSON cannot carry"):
        await server.call_tool("nonfinite", {"literal": "1e400"})
    assert time.monotonic() - started < FAST
    assert (await server.call_tool("echo", {"n": 1}))["structuredContent"] == {"value": {"n": 1}}


def test_child_lines_are_parsed_finite_or_refused() -> None:
    for line in (b'{"id":1,"result":1e400}', b'[NaN]', b'{"a":[-Infinity]}', b'[-1e400]', b'{"a":1e400, broken'):
        with pytest.raises(NonFinite):
            parse_text_of(line)
    assert parse_text_of(b'{"id":1,"result":[1.5,1e308,1.5e-400,-0.0,10000000000000000000000]}') == {
        "id": 1, "result": [1.5, 1e308, 0.0, -0.0, 10**22]}
    assert parse_text_of('{"t":"é\\ud800"}'.encode()) == {"t": "é\ud800"}
    with pytest.raises(ValueError):
        parse_text_of(b"not json")


def parse_text_of(line: bytes) -> object:
    """A stdout line as the peer reads it: decoded, then parsed."""
    return parse_text(decode_line(line))
