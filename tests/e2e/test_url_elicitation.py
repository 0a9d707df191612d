"""A tool server's URL-mode elicitations and their completion, through the real daemon (gatewayd/elicitations.py).

A scripted child (tests/fixtures/askersrv.py) asks a session for a URL-mode elicitation during a call, or answers a
call with URLElicitationRequiredError (-32042); later it sends `notifications/elicitation/complete`. The session
that was asked hears it on its own stream, once; another session does not; an id nobody was asked is dropped. A
session's own child (`isolation = "session"`) logging outside any call is heard on that session's stream; a client's
own child (`isolation = "client"`), on that client's sessions' streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio

from tests.daemon import REPO, Daemon, python_command, write_config
from tests.e2e.test_mcp_sdk import TEST_DEADLINE, http_session, raw_session, session_headers, sse_events

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASKERSRV: Final = REPO / "tests" / "fixtures" / "askersrv.py"
COMPLETE: Final = "notifications/elicitation/complete"


@dataclass
class Rig:
    daemon: Daemon
    token: str
    # Another client, with the same grants.
    other: str


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("url-elicitation")
    server = python_command(str(ASKERSRV)) + '\nrelay = ["elicitation"]\n'
    tokens = write_config(root, {"ask": server, "own": server + 'isolation = "session"\n',
                                 "mine": server + 'isolation = "client"\n'},
                          '[roles.agent]\nallow = ["ask.*", "own.*", "mine.*"]\n',
                          {"agent": ["agent"], "other": ["agent"]})
    async with Daemon(root) as daemon:
        yield Rig(daemon, tokens["agent"], tokens["other"])


def url_elicitation(elicitation_id: str) -> dict[str, Any]:
    return {"mode": "url", "elicitationId": elicitation_id, "url": f"https://example.test/{elicitation_id}",
            "message": "Sign in to the example service"}


def complete(elicitation_id: str) -> dict[str, Any]:
    return {"method": COMPLETE, "params": {"elicitationId": elicitation_id}}


class Caller:
    """One MCP session that declared URL-mode elicitation, with its GET stream open."""

    def __init__(self, http: aiohttp.ClientSession, rig: Rig, token: str | None = None) -> None:
        self.http, self.rig = http, rig
        self.token = token or rig.token
        self.session_id = ""
        self.stream: aiohttp.ClientResponse | None = None

    async def start(self) -> Caller:
        self.session_id = await raw_session(self.http, self.rig.daemon.url, self.token, {"elicitation": {"url": {}}})
        self.stream = await self.http.get(self.rig.daemon.url,
                                          headers={**self.headers(), "Accept": "text/event-stream"})
        assert self.stream.status == 200
        return self

    def headers(self) -> dict[str, str]:
        return session_headers(self.token, self.session_id)

    async def post(self, message: dict[str, Any]) -> int:
        async with self.http.post(self.rig.daemon.url, json=message, headers=self.headers()) as response:
            await response.read()
            return response.status

    async def call(self, arguments: dict[str, Any], answer: dict[str, Any] | None = None,
                   tool: str = "ask__ask") -> dict[str, Any]:
        """Call the child's `ask`; each request it relays is answered with `answer`. The call's own answer."""
        message = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": tool,
                                                                               "arguments": arguments}}
        async with self.http.post(self.rig.daemon.url, json=message, headers=self.headers()) as response:
            if response.content_type == "application/json":
                return await response.json()  # type: ignore[no-any-return]
            async for event in _events(response):
                if event.get("id") == 9 and "method" not in event:
                    return event
                if event.get("method") == "elicitation/create":
                    assert answer is not None
                    await self.post({"jsonrpc": "2.0", "id": event["id"], "result": answer})
        raise AssertionError("the call's stream ended without its answer")

    async def heard(self) -> dict[str, Any]:
        """The next message on the session's GET stream."""
        assert self.stream is not None
        async for event in _events(self.stream):
            return event
        raise AssertionError("the GET stream ended")


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for event in sse_events(response):
        if event.get("data"):
            yield json.loads(event["data"])


@asynccontextmanager
async def callers(rig: Rig) -> AsyncIterator[tuple[Caller, Caller]]:
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        first, second = await Caller(http, rig).start(), await Caller(http, rig).start()
        try:
            yield first, second
        finally:
            for caller in (first, second):
                if caller.stream is not None:
                    caller.stream.close()


async def test_a_completion_reaches_only_the_session_asked_and_only_once(rig: Rig) -> None:
    async with callers(rig) as (alice, bob):
        for caller, name in ((alice, "el-a"), (bob, "el-b")):
            asked = await caller.call({"send": [{"id": f"ask-{name}", "method": "elicitation/create",
                                                 "params": url_elicitation(name)}], "expect": 1},
                                      answer={"action": "accept"})
            [reply] = json.loads(asked["result"]["content"][0]["text"])
            assert reply["result"] == {"action": "accept"}
        # Later, out of band, both complete; so does one nobody was asked; el-a is said twice.
        await alice.call({"send": [complete("el-a"), complete("el-x"), complete("el-a"), complete("el-b")],
                          "expect": 0})
        told_alice = await alice.heard()
        told_bob = await bob.heard()
        # Alice's next is not a second el-a: a marker asked and completed after it comes first.
        await alice.call({"send": [{"id": "ask-el-m", "method": "elicitation/create",
                                    "params": url_elicitation("el-m")}], "expect": 1}, answer={"action": "accept"})
        await alice.call({"send": [complete("el-m")], "expect": 0})
        then_alice = await alice.heard()
    assert told_alice == {"jsonrpc": "2.0", "method": COMPLETE, "params": {"elicitationId": "el-a"}}
    assert told_bob == {"jsonrpc": "2.0", "method": COMPLETE, "params": {"elicitationId": "el-b"}}
    assert then_alice["params"] == {"elicitationId": "el-m"}


async def test_a_url_elicitation_required_error_reaches_the_caller_and_its_completion_follows(rig: Rig) -> None:
    error = {"code": -32042, "message": "Sign in first",
             "data": {"elicitations": [url_elicitation("el-c")]}}
    async with callers(rig) as (alice, _bob):
        answered = await alice.call({"fail": error})
        await alice.call({"send": [complete("el-c")], "expect": 0})
        told = await alice.heard()
    assert answered["error"] == error  # the server's own error, verbatim: the client knows what to open
    assert told == {"jsonrpc": "2.0", "method": COMPLETE, "params": {"elicitationId": "el-c"}}


def logged(level: str, data: str) -> dict[str, Any]:
    return {"method": "notifications/message", "params": {"level": level, "logger": "own", "data": data}}


async def test_a_session_s_own_child_logging_outside_a_call_is_heard_on_the_session_s_stream(rig: Rig) -> None:
    line, quiet = logged("warning", "disk low"), logged("debug", "noise")
    async with callers(rig) as (alice, bob):
        assert await alice.post({"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
                                 "params": {"level": "info"}}) == 200
        await alice.call({"after": [quiet, line]}, tool="own__ask")
        told = await alice.heard()
        # Bob's child is his own: he hears his, and never Alice's.
        await bob.call({"after": [logged("warning", "bob's")]}, tool="own__ask")
        bobs = await bob.heard()
    assert told == {"jsonrpc": "2.0", **line}  # the debug line was below her level
    assert bobs["params"]["data"] == "bob's"


async def test_a_client_s_own_child_logging_outside_a_call_is_heard_by_that_client_s_sessions_only(rig: Rig) -> None:
    line = logged("warning", "quota low")
    async with callers(rig) as (alice, bob):
        carol = await Caller(alice.http, rig, rig.other).start()
        try:
            # Alice's and Bob's sessions are one client's: its child (`isolation = "client"`) is theirs.
            await alice.call({"after": [line]}, tool="mine__ask")
            told = [await alice.heard(), await bob.heard()]
            # Carol is another client, with a child of her own: she hears hers first, never theirs.
            await carol.call({"after": [logged("warning", "carol's")]}, tool="mine__ask")
            carols = await carol.heard()
        finally:
            assert carol.stream is not None
            carol.stream.close()
    assert told == [{"jsonrpc": "2.0", **line}] * 2
    assert carols["params"]["data"] == "carol's"
