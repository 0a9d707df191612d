"""The relay's endings and bad input from either side, through the real daemon (gatewayd/relay.py, upstream/peer.py).

A scripted child (tests/fixtures/askersrv.py) sends its client what each test says during a call and reports every
reply it got; a raw HTTP client that declared sampling is the caller, answering (or not) by hand. Every request of
the child gets exactly one reply, never none: when the client does not answer within `relay_timeout` (set short
here), when the caller cancels the call or disconnects, for an unknown method, bad params, a reused id, or past the
per-call limit — but for one the child cancels itself, which is withdrawn from the caller and answered to no one.
A client answering a request that was not put to its session, or answering twice, is dropped. A request the child
sent as a task and then cancelled is withdrawn from the caller too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio

from gatewayd.relay import MAX_RELAYED_PER_CALL, RELAY_ID_PREFIX
from tests.daemon import REPO, Daemon, python_command, write_config
from tests.e2e.test_mcp_sdk import TEST_DEADLINE, http_session, mcp_post, raw_session, session_headers
from tests.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASKERSRV: Final = REPO / "tests" / "fixtures" / "askersrv.py"
# Short, so that a test crosses it; the default is 300 s.
RELAY_TIMEOUT: Final = 1.0
SAMPLING: Final[dict[str, Any]] = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                                   "maxTokens": 5}
ANSWER: Final[dict[str, Any]] = {"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}


@dataclass
class Rig:
    daemon: Daemon
    token: str
    log: Path

    def told(self) -> list[dict[str, Any]]:
        """Every reply the child got to its own requests, in order (also those of calls that ended)."""
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("relay-daemon")
    log = root / "told.jsonl"
    server = python_command(str(ASKERSRV)) + f'\nenv = {{ ASKERSRV_LOG = "{log}" }}\nrelay = ["sampling"]\n'
    tokens = write_config(root, {"ask": server}, '[roles.agent]\nallow = ["ask.*"]\n', {"agent": ["agent"]})
    async with Daemon(root, env={"GATEWAYD_RELAY_TIMEOUT": str(RELAY_TIMEOUT)}) as daemon:
        yield Rig(daemon, tokens["agent"], log)


class Caller:
    """One MCP session that declared sampling, speaking raw HTTP so that it can answer late, twice, or never."""

    def __init__(self, http: aiohttp.ClientSession, rig: Rig) -> None:
        self.http, self.rig = http, rig
        self.session_id = ""
        self.ids = iter(range(1, 10_000))

    async def start(self) -> Caller:
        self.session_id = await raw_session(self.http, self.rig.daemon.url, self.rig.token, {"sampling": {}})
        return self

    def headers(self) -> dict[str, str]:
        return session_headers(self.rig.token, self.session_id)

    async def post(self, message: dict[str, Any]) -> int:
        """Send a notification or a response; the status it got (202)."""
        async with self.http.post(self.rig.daemon.url, json=message, headers=self.headers()) as response:
            await response.read()
            return response.status

    async def answer(self, request_id: Any, result: dict[str, Any]) -> int:
        return await self.post({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def ask(self, send: list[dict[str, Any]], expect: int) -> list[dict[str, Any]]:
        """Call the child's `ask` tool without answering anything; the replies the child got to what it sent."""
        message = self.call(send, expect)
        exchange = await mcp_post(self.http, self.rig.daemon.url, self.rig.token, message, self.session_id)
        return json.loads(exchange.response["result"]["content"][0]["text"])  # type: ignore[no-any-return]

    def call(self, send: list[dict[str, Any]], expect: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": next(self.ids), "method": "tools/call",
                "params": {"name": "ask__ask", "arguments": {"send": send, "expect": expect}}}

    @asynccontextmanager
    async def streaming(self, message: dict[str, Any]) -> AsyncIterator[Stream]:
        """POST a call and read its SSE answer message by message."""
        async with self.http.post(self.rig.daemon.url, json=message, headers=self.headers()) as response:
            assert response.content_type == "text/event-stream"
            yield Stream(response)


class Stream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> dict[str, Any]:
        """The next JSON-RPC message of the stream (keep-alives and priming events skipped)."""
        async for line in self.response.content:
            if line.startswith(b"data:") and line[5:].strip():
                return json.loads(line[5:])  # type: ignore[no-any-return]
        raise AssertionError("the stream ended")

    async def relayed(self) -> dict[str, Any]:
        message = await self.next()
        assert message.get("method") == "sampling/createMessage" and message["id"].startswith(RELAY_ID_PREFIX)
        return message

    def close(self) -> None:
        self.response.close()


@asynccontextmanager
async def caller(rig: Rig) -> AsyncIterator[Caller]:
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        yield await Caller(http, rig).start()


def sampling(child_id: Any, params: Any = None) -> dict[str, Any]:
    return {"id": child_id, "method": "sampling/createMessage", "params": SAMPLING if params is None else params}


async def test_a_question_nobody_answers_times_out_with_an_error_to_the_child(rig: Rig) -> None:
    async with caller(rig) as client:
        [reply] = await client.ask([sampling("t1")], 1)
    assert reply["id"] == "t1" and reply["error"]["code"] == -32001
    assert f"within {RELAY_TIMEOUT:g}s" in reply["error"]["message"]


async def test_the_callers_cancel_answers_the_child(rig: Rig) -> None:
    async with caller(rig) as client:
        call = client.call([sampling("c1")], 1)
        async with client.streaming(call) as stream:
            await stream.relayed()
            status = await client.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                        "params": {"requestId": call["id"], "reason": "changed my mind"}})
        assert status == 202
        await eventually(lambda: any(reply["id"] == "c1" for reply in rig.told()), what="the child is told")
    [reply] = [reply for reply in rig.told() if reply["id"] == "c1"]
    assert reply["error"]["code"] == -32000


async def test_the_callers_disconnect_answers_the_child(rig: Rig) -> None:
    async with caller(rig) as client:
        async with client.streaming(client.call([sampling("d1")], 1)) as stream:
            await stream.relayed()
            stream.close()
        await eventually(lambda: any(reply["id"] == "d1" for reply in rig.told()), what="the child is told")
    [reply] = [reply for reply in rig.told() if reply["id"] == "d1"]
    assert reply["error"]["code"] == -32000 and "disconnected" in reply["error"]["message"]


async def test_an_unknown_method_and_bad_params_are_answered_with_errors_at_once(rig: Rig) -> None:
    async with caller(rig) as client:
        unknown, bad = await client.ask([{"id": "u1", "method": "telepathy/read", "params": {}},
                                         sampling("b1", {"messages": "hi", "maxTokens": 5})], 2)
    assert unknown == {"jsonrpc": "2.0", "id": "u1", "error": {"code": -32601, "message": "Method not found"}}
    assert bad["id"] == "b1" and bad["error"]["code"] == -32602 and "messages" in bad["error"]["message"]


async def test_a_reused_id_is_refused_and_answers_to_the_wrong_session_or_twice_are_dropped(rig: Rig) -> None:
    async with caller(rig) as client, caller(rig) as stranger:
        async with client.streaming(client.call([sampling("r1"), sampling("r1")], 2)) as stream:
            asked = await stream.relayed()
            # Another session of the same client answers a question that was not put to it: dropped.
            assert await stranger.answer(asked["id"], {**ANSWER, "model": "stranger"}) == 202
            assert await client.answer(asked["id"], ANSWER) == 202
            assert await client.answer(asked["id"], {**ANSWER, "model": "twice"}) == 202
            result = await stream.next()
        # A later call to the same child: by its answer, anything written to the child before has been read.
        assert await client.ask([], 0) == []
    refused, answered = json.loads(result["result"]["content"][0]["text"])
    assert refused["id"] == "r1" and refused["error"]["code"] == -32600
    assert answered == {"jsonrpc": "2.0", "id": "r1", "result": ANSWER}
    assert [reply for reply in rig.told() if reply["id"] == "r1"] == [refused, answered], "one answer each"


async def test_a_child_flooding_its_caller_during_one_call_is_refused_past_the_limit(rig: Rig) -> None:
    extra = 3
    flood = [sampling(f"f{number}") for number in range(MAX_RELAYED_PER_CALL + extra)]
    async with caller(rig) as client:
        replies = await client.ask(flood, len(flood))
    codes = [reply["error"]["code"] for reply in replies]
    # Past the limit, refused at once; the rest were put to the caller, who never answered.
    assert codes == [-32601] * extra + [-32001] * MAX_RELAYED_PER_CALL
    assert all("already wait for its caller" in reply["error"]["message"] for reply in replies[:extra])


async def test_a_question_the_child_sent_as_a_task_and_then_cancelled_is_withdrawn_from_its_caller(rig: Rig) -> None:
    async with caller(rig) as client:
        call = client.call([sampling("h1", {**SAMPLING, "task": {"ttl": 60000}})], 1)
        call["params"]["arguments"]["cancel_tasks"] = True
        async with client.streaming(call) as stream:
            asked = await stream.relayed()
            withdrawn = await stream.next()
            result = await stream.next()
        # The caller's answer, coming after all, is dropped: the child asked for nothing more.
        assert await client.answer(asked["id"], ANSWER) == 202
        assert await client.ask([], 0) == []
    assert "task" not in asked["params"]  # put to the caller as the plain request it is
    assert withdrawn == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": asked["id"], "reason": "withdrawn"}}
    created, cancelled = json.loads(result["result"]["content"][0]["text"])
    assert created["id"] == "h1" and created["result"]["task"]["status"] == "working"
    assert cancelled["result"]["status"] == "cancelled"
    assert [reply for reply in rig.told() if reply["id"] == "h1"] == [created]


async def test_a_question_the_child_cancels_is_withdrawn_from_its_caller_and_the_child_gets_no_answer(
        rig: Rig) -> None:
    async with caller(rig) as client:
        cancel = {"method": "notifications/cancelled", "params": {"requestId": "x1", "reason": "no longer needed"}}
        async with client.streaming(client.call([sampling("x1"), cancel], 0)) as stream:
            asked = await stream.relayed()
            withdrawn = await stream.next()
            result = await stream.next()
        # The caller answers all the same: dropped, and the child, which cancelled it, is sent nothing.
        assert await client.answer(asked["id"], ANSWER) == 202
        assert await client.ask([], 0) == []
    assert withdrawn == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": asked["id"], "reason": "withdrawn"}}
    assert json.loads(result["result"]["content"][0]["text"]) == []
    assert [reply for reply in rig.told() if reply["id"] == "x1"] == []
