"""Requests a child sends the gateway unasked: answered by `on_request`, or by the default, under the child's own
id; and a log line written just after a call's answer, which is no longer that call's."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gatewayd import jsontext
from gatewayd.upstream.connection import Connection
from gatewayd.upstream.peer import default_reply
from tests.waiting import eventually

ASKSRV = Path(__file__).resolve().parents[1] / "fixtures" / "asksrv.py"
# Bound on the child's report; generous for a loaded 2-core machine.
REPORT_TIMEOUT = 20.0

Handler = Callable[[dict[str, Any]], dict[str, Any] | None]


@asynccontextmanager
async def asking(*asks: str, on_request: Handler | None = None) -> AsyncIterator[Connection]:
    """A Connection to the asking fixture, which sends the gateway one request per `ID=METHOD` of `asks`."""
    conn = Connection("asking", [sys.executable, str(ASKSRV), *asks], on_request=on_request)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()


async def test_a_custom_reply_reaches_the_child_under_its_own_id() -> None:
    asked: list[dict[str, Any]] = []

    def answer(message: dict[str, Any]) -> dict[str, Any] | None:
        asked.append(message)
        if message["method"] == "later":
            return None
        if message["method"] == "ping":
            return default_reply(message)
        return {"jsonrpc": "2.0", "id": message["id"], "result": {"roots": [], "for": message["params"]}}

    # The child's first id is 1, as is the gateway's first: each side's id space is its own.
    async with asking("1=roots/list", '"p"=ping', '"l"=later', "7=sampling/createMessage", on_request=answer) as conn:
        replies = await conn.call("report", None, timeout=REPORT_TIMEOUT)
        assert conn.in_flight == 0
    assert [(m["id"], m["method"], m["params"]) for m in asked] == [
        (1, "roots/list", {"asked": "roots/list"}),
        ("p", "ping", {"asked": "ping"}),
        ("l", "later", {"asked": "later"}),
        (7, "sampling/createMessage", {"asked": "sampling/createMessage"}),
    ]
    assert replies == [
        {"jsonrpc": "2.0", "id": 1, "result": {"roots": [], "for": {"asked": "roots/list"}}},
        {"jsonrpc": "2.0", "id": "p", "result": {}},
        {"jsonrpc": "2.0", "id": 7, "result": {"roots": [], "for": {"asked": "sampling/createMessage"}}},
    ]


async def test_without_on_request_ping_is_answered_and_the_rest_refused() -> None:
    async with asking('"p"=ping', "1=roots/list") as conn:
        replies = await conn.call("report", None, timeout=REPORT_TIMEOUT)
    assert replies == [
        {"jsonrpc": "2.0", "id": "p", "result": {}},
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}},
    ]


async def test_a_reply_left_for_later_reaches_the_child_when_sent() -> None:
    later: list[dict[str, Any]] = []
    asked = asyncio.Event()

    def answer(message: dict[str, Any]) -> dict[str, Any] | None:
        later.append(message)
        asked.set()
        return None  # "I will reply later"

    async with asking('"l"=later', on_request=answer) as conn:
        report = asyncio.ensure_future(conn.call("report", None, timeout=REPORT_TIMEOUT))
        await asyncio.wait_for(asked.wait(), REPORT_TIMEOUT)
        assert conn.reply({"jsonrpc": "2.0", "id": later[0]["id"], "result": {"late": True}})
        replies = await report
    assert replies == [{"jsonrpc": "2.0", "id": "l", "result": {"late": True}}]
    assert not conn.reply({"jsonrpc": "2.0", "id": "l", "result": {}}), "the child is gone: nothing is written"


async def test_a_reply_carrying_a_large_string_reaches_the_child_intact_made_from_its_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    parts = jsontext.parts

    def watched(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, dict) and "jsonrpc" in value:  # a whole line, not a part of one
            made.append(value.get("id"))
        return parts(value, *args, **kwargs)

    monkeypatch.setattr(jsontext, "parts", watched)
    text = ('é"\\\n\x01\u2028\U0001f600 ' * (jsontext.LARGE_STRING // 8 + 1))[:jsontext.LARGE_STRING + 1]
    asked = asyncio.Event()
    async with asking('"l"=later', on_request=lambda message: asked.set()) as conn:
        report = asyncio.ensure_future(conn.call("report", None, timeout=REPORT_TIMEOUT))
        await asyncio.wait_for(asked.wait(), REPORT_TIMEOUT)
        sampled = {"role": "assistant", "content": {"type": "text", "text": text}}
        assert conn.reply({"jsonrpc": "2.0", "id": "l", "result": sampled})
        replies = await report
    assert replies == [{"jsonrpc": "2.0", "id": "l", "result": sampled}]
    assert made == ["l"]


async def test_a_reused_id_of_a_request_still_waiting_is_refused_and_the_first_unharmed() -> None:
    asked: list[dict[str, Any]] = []

    def answer(message: dict[str, Any]) -> dict[str, Any] | None:
        asked.append(message)
        return None if message["method"] == "later" else default_reply(message)

    # The second "l" comes while the first waits for its reply; the last request (9) ends the child's report.
    async with asking('"l"=later', '"l"=later', '{"not": "an id"}=later', "9=ping", on_request=answer) as conn:
        first = await conn.call("report", None, timeout=REPORT_TIMEOUT)
        assert conn.reply({"jsonrpc": "2.0", "id": "l", "result": {"late": True}})
        then = await conn.call("report", None, timeout=REPORT_TIMEOUT)
    assert [(m["id"], m["method"]) for m in asked] == [("l", "later"), (9, "ping")], "only the first reached the relay"
    reused, bad, pinged = first
    assert reused["id"] == "l" and reused["error"]["code"] == -32600 and "already in use" in reused["error"]["message"]
    assert bad["id"] is None and bad["error"]["code"] == -32600
    assert pinged == {"jsonrpc": "2.0", "id": 9, "result": {}}
    assert then[3:] == [{"jsonrpc": "2.0", "id": "l", "result": {"late": True}}]


# Answers its first request and writes a log line with it, in one write; then waits for stdin to close.
ANSWER_THEN_LOG = (
    "import json, sys\n"
    "request = json.loads(sys.stdin.readline())\n"
    "answer = {'jsonrpc': '2.0', 'id': request['id'], 'result': {'ok': True}}\n"
    "log = {'jsonrpc': '2.0', 'method': 'notifications/message', 'params': {'level': 'info', 'data': 'after'}}\n"
    "sys.stdout.write(json.dumps(answer) + '\\n' + json.dumps(log) + '\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stdin.read()\n"
)


async def test_a_log_line_written_just_after_the_only_call_s_answer_is_not_that_call_s() -> None:
    unasked: list[dict[str, Any]] = []
    heard: list[dict[str, Any]] = []
    conn = Connection("after", [sys.executable, "-c", ANSWER_THEN_LOG], on_notification=unasked.append)
    await conn.open()
    try:
        assert await conn.call("work", None, timeout=REPORT_TIMEOUT, on_event=heard.append) == {"ok": True}
        await eventually(lambda: bool(unasked), what="the log line reached the server's own handler")
    finally:
        await conn.close()
    # Read in the same chunk as the answer, before the call let go of its entry: the call was over, not in flight.
    assert [message["params"]["data"] for message in unasked] == ["after"] and heard == []
