"""The web approval page's HTTP API: operator tokens only, approve/deny with their statuses, the live stream."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatewayd import approvals
from gatewayd.state import DaemonState
from gatewayd.tokens import hash_token, new_token
from gatewayd.web import console
from tests.daemon import Daemon, python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import eventually

API = console.API_PATH
# Calls that wait for a person: `add` for plain results, `echo` to show arbitrary arguments back.
CALC = python_command("-m", "gatewayd.examples.calc") + """
protocol = "jsonrpc"
[methods.add]
confirm = true
[methods.echo]
confirm = true
"""
ROLES = '[roles.calc]\nallow = ["calc.*"]\n'
# The same grant, but its confirmations may not be answered on the web page.
ROLES_NO_WEB = ROLES + '[roles.calc.confirmation."calc.*"]\nchannels = ["client"]\n'
# Bound on reading one event (or the end) from a stream.
EVENT_TIMEOUT = 10.0


@dataclass
class Tokens:
    agent: str
    operator: str


def console_config(root: Path, roles: str = ROLES) -> Tokens:
    """A config with the calc server (confirm-gated), client `agent` and operator `alice`."""
    clients = write_config(root, {"calc": CALC}, roles, {"agent": ["calc"]})
    operator = new_token()
    (root / "policies" / "operators.toml").write_text(f'[operators.alice]\ntoken_sha256 = "{hash_token(operator)}"\n')
    return Tokens(clients["agent"], operator)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_call(client: LocalClient, token: str, method: str, params: Any) -> asyncio.Task[dict[str, Any]]:
    """A JSON-RPC call in the background; it waits until someone answers its approval."""

    async def call() -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        async with await client.post("/mcp", json=body, headers=bearer(token)) as response:
            answer: dict[str, Any] = await response.json()
            return answer

    return asyncio.create_task(call())


async def pending_id(state: DaemonState, count: int = 1) -> str:
    """The id of the newest pending approval, once `count` are pending."""
    await eventually(lambda: len(state.approvals.pending()) >= count, what=f"{count} approvals pending")
    return state.approvals.pending()[-1].id


async def decide(client: LocalClient, token: str, approval_id: str, verb: str, body: Any = None, *,
                 raw: bytes | None = None) -> tuple[int, Any]:
    """POST an answer with `body` as JSON (or `raw` bytes); (status, decoded JSON or text)."""
    headers = {**bearer(token), "Content-Type": "application/json"}
    data = raw if raw is not None else None if body is None else json.dumps(body)
    response = await client.post(f"{API}/{approval_id}/{verb}", data=data, headers=headers)
    text = await response.text()
    return response.status, json.loads(text) if response.content_type == "application/json" else text


class Events:
    """An SSE reader: `next()` is the next event as (name, payload), skipping keep-alive comments."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments = 0

    async def block(self) -> bytes:
        async with asyncio.timeout(EVENT_TIMEOUT):
            return await self.response.content.readuntil(b"\n\n")

    async def next(self) -> tuple[str, Any]:
        while True:
            block = await self.block()
            assert block, "the stream ended"
            lines = block.decode().strip("\n").split("\n")
            if all(line.startswith(":") for line in lines):
                self.comments += 1
                continue
            assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), lines
            return lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: "))


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[LocalClient, DaemonState, Tokens]]:
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path, sse_keepalive=0.2) as (client, state):
        yield client, state, tokens


Stack = tuple[LocalClient, DaemonState, Tokens]


# -- the page ----------------------------------------------------------------------------------------------


async def test_the_page_needs_no_token_and_allows_only_its_own_inline_code(stack: Stack) -> None:
    client, _, _ = stack
    response = await client.get("/approvals")
    assert response.status == 200 and response.content_type == "text/html"
    page = await response.text()
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "form-action 'none'" in csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    # The CSP's hashes are those of the inline script and style actually served.
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        match = re.search(f"<{tag}>(.*?)</{tag}>", page, re.S)
        assert match is not None
        digest = base64.b64encode(hashlib.sha256(match.group(1).encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in csp
    assert response.headers["Cache-Control"] == "no-store"
    # Attacker-controlled arguments are only ever inserted as text; nothing is loaded from elsewhere.
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
    assert not re.search(r"\b(src|href|action)=", page)


# -- authentication ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["none", "agent", "wrong", "basic"])
async def test_every_api_route_refuses_anyone_but_an_operator(stack: Stack, who: str) -> None:
    client, state, tokens = stack
    call = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
    approval_id = await pending_id(state)
    headers = {"none": {}, "agent": bearer(tokens.agent), "wrong": bearer(new_token()),
               "basic": {"Authorization": "Basic YWxpY2U6eA=="}}[who]
    for method, path in [("GET", f"{API}/pending"), ("GET", f"{API}/stream"),
                         ("POST", f"{API}/{approval_id}/approve"), ("POST", f"{API}/{approval_id}/deny")]:
        async with client.session.request(method, client.base + path, headers=headers) as response:
            assert response.status == 401, (method, path)
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    # None of that decided anything.
    assert [a.id for a in state.approvals.pending()] == [approval_id]
    await decide(client, tokens.operator, approval_id, "deny")
    await call


# -- approve and deny --------------------------------------------------------------------------------------


async def test_approve_lets_the_call_run_and_a_second_answer_changes_nothing(stack: Stack) -> None:
    client, state, tokens = stack
    call = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
    approval_id = await pending_id(state)
    listed = await (await client.get(f"{API}/pending", headers=bearer(tokens.operator))).json()
    [shown] = listed["approvals"]
    assert shown["id"] == approval_id and shown["client"] == "agent" and shown["method"] == "calc.add"
    assert shown["arguments"] == {"a": 2, "b": 3} and shown["state"] == "pending" and "web" in shown["channels"]
    assert "session_id" not in shown

    status, body = await decide(client, tokens.operator, approval_id, "approve")
    assert status == 200 and body["ok"] is True and "approved" in body["message"]
    assert body["approval"]["state"] == "approved"
    assert body["approval"]["decided_by"] == "operator alice (web page)" and body["approval"]["channel"] == "web"
    assert (await call)["result"] == 5

    for verb in ("approve", "deny"):
        status, body = await decide(client, tokens.operator, approval_id, verb)
        assert status == 409 and body["ok"] is False and "already approved" in body["message"]
        assert body["approval"]["state"] == "approved"
    listed = await (await client.get(f"{API}/pending", headers=bearer(tokens.operator))).json()
    assert listed == {"approvals": []}


async def test_deny_tells_the_caller_why(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    client, state, tokens = stack
    call = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
    approval_id = await pending_id(state)
    with caplog.at_level("INFO", logger="gatewayd.web.console"):
        status, body = await decide(client, tokens.operator, approval_id, "deny",
                                    {"reason": "  not during\nthe freeze  "})
    assert status == 200 and body["ok"] is True and body["approval"]["state"] == "denied"
    error = (await call)["error"]
    assert error["code"] == -32015
    assert error["data"]["approval_id"] == approval_id and error["data"]["reason"] == "not during the freeze"
    assert error["data"]["decided_by"] == "operator alice (web page)"
    assert any("operator alice denied approval " + approval_id in r.getMessage() for r in caplog.records)


async def test_an_unknown_approval_is_404(stack: Stack) -> None:
    client, _, tokens = stack
    for verb in ("approve", "deny"):
        status, body = await decide(client, tokens.operator, "0123456789", verb)
        assert status == 404 and body["ok"] is False and body["approval"] is None and "no approval" in body["message"]


@pytest.mark.parametrize(("body", "expected"), [
    (b"not json", 400), (b"[]", 400), (b'"reason"', 400), (b'{"reason": 5}', 400), (b'{"reson": "typo"}', 400),
    (b"\xff", 400), (b"[" * 5000, 400), (json.dumps({"reason": "x" * (approvals.MAX_REASON_CHARS + 1)}).encode(), 400),
    (json.dumps({"reason": "bell \a"}).encode(), 400), (b" " * (console.MAX_DECISION_BODY_BYTES + 1), 413),
])
async def test_a_body_that_is_not_a_reason_is_refused_and_decides_nothing(
    stack: Stack, body: bytes, expected: int
) -> None:
    client, state, tokens = stack
    call = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
    approval_id = await pending_id(state)
    status, _ = await decide(client, tokens.operator, approval_id, "deny", raw=body)
    assert status == expected
    assert state.approvals.pending()[0].id == approval_id
    status, _ = await decide(client, tokens.operator, approval_id, "approve", {"reason": None})
    assert status == 200 and (await call)["result"] == 5


async def test_a_policy_without_the_web_channel_refuses_web_answers(tmp_path: Path) -> None:
    tokens = console_config(tmp_path, ROLES_NO_WEB)
    async with running_stack(tmp_path) as (client, state):
        call = start_call(client, tokens.agent, "calc.add", {"a": 2, "b": 3})
        approval_id = await pending_id(state)
        status, body = await decide(client, tokens.operator, approval_id, "approve")
        assert status == 409 and body["ok"] is False and "web channel" in body["message"]
        assert body["approval"]["state"] == "pending" and "web" not in body["approval"]["channels"]
        # gatewayctl's channel still works.
        assert state.approvals.decide(approval_id, approve=True, by="test", channel=approvals.CLI).ok
        assert (await call)["result"] == 5


# -- the live stream ---------------------------------------------------------------------------------------


async def test_the_stream_sends_the_list_then_each_change(stack: Stack) -> None:
    client, state, tokens = stack
    first = start_call(client, tokens.agent, "calc.add", {"a": 1, "b": 1})
    first_id = await pending_id(state)
    async with await client.get(f"{API}/stream", headers=bearer(tokens.operator)) as response:
        assert response.status == 200 and response.content_type == "text/event-stream"
        events = Events(response)
        name, snapshot = await events.next()
        assert name == "snapshot" and [a["id"] for a in snapshot["approvals"]] == [first_id]
        assert snapshot["keepalive_s"] == 0.2

        second = start_call(client, tokens.agent, "calc.echo", {"text": "line one\nline two"})
        name, change = await events.next()
        assert name == "change" and change["type"] == "pending"
        second_id = change["approval"]["id"]
        assert second_id != first_id and change["approval"]["arguments"] == {"text": "line one\nline two"}

        await decide(client, tokens.operator, second_id, "approve")
        name, change = await events.next()
        assert (name, change["type"], change["approval"]["id"]) == ("change", "finished", second_id)
        assert change["approval"]["state"] == "approved"
        assert (await second)["result"] == {"text": "line one\nline two"}

        await decide(client, tokens.operator, first_id, "deny", {"reason": "no"})
        name, change = await events.next()
        assert change["type"] == "finished" and change["approval"]["reason"] == "no"
        assert (await first)["error"]["code"] == -32015
        # Quiet now: keep-alive comments keep flowing.
        comments = events.comments
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await events.next()
        assert events.comments > comments
    await eventually(lambda: not state.approvals._watchers, what="the stream's watcher is released")


async def test_the_page_sees_an_approval_expire_and_one_withdrawn_by_its_caller(tmp_path: Path) -> None:
    roles = ROLES + '[roles.calc.confirmation."calc.add"]\ntimeout = "300ms"\n'  # calc.echo waits 60 s
    tokens = console_config(tmp_path, roles)
    async with running_stack(tmp_path, sse_keepalive=0.2) as (client, state), \
            await client.get(f"{API}/stream", headers=bearer(tokens.operator)) as response:
        events = Events(response)
        assert (await events.next())[0] == "snapshot"
        expired = start_call(client, tokens.agent, "calc.add", {"a": 1, "b": 2})
        assert (await events.next())[1]["type"] == "pending"
        _, change = await events.next()
        assert (change["type"], change["approval"]["state"]) == ("finished", "expired")
        assert (await expired)["error"]["code"] == -32016
        status, late = await decide(client, tokens.operator, change["approval"]["id"], "approve")
        assert status == 409 and "already expired" in late["message"]

        async with aiohttp.ClientSession() as caller:
            body = {"jsonrpc": "2.0", "id": 1, "method": "calc.echo", "params": {"text": "bye"}}
            gone = asyncio.create_task(caller.post(f"{client.base}/mcp", json=body, headers=bearer(tokens.agent)))
            _, change = await events.next()
            assert change["type"] == "pending"
        _, change = await events.next()  # the caller's connection closed with its session
        assert (change["type"], change["approval"]["state"]) == ("finished", "withdrawn")
        assert change["approval"]["reason"] == "the caller disconnected"
        gone.cancel()
        status, late = await decide(client, tokens.operator, change["approval"]["id"], "approve")
        assert status == 409 and "withdrawn" in late["message"]


async def test_a_reader_that_fell_behind_gets_the_whole_list_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, state, tokens = stack
    async with await client.get(f"{API}/stream", headers=bearer(tokens.operator)) as response:
        events = Events(response)
        assert await events.next() == ("snapshot", {"approvals": [], "keepalive_s": 0.2})
        # Every watcher is now "too far behind" at its next change.
        monkeypatch.setattr(approvals, "WATCHER_BACKLOG", 0)
        calls = []
        for count in (1, 2):
            calls.append(start_call(client, tokens.agent, "calc.add", {"a": count, "b": 0}))
            await pending_id(state, count)
            name, snapshot = await events.next()
            assert name == "snapshot" and len(snapshot["approvals"]) == count
        monkeypatch.undo()
        for approval in state.approvals.pending():
            await decide(client, tokens.operator, approval.id, "approve")
        assert [(await call)["result"] for call in calls] == [1, 2]


async def test_too_many_open_streams_are_refused(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    client, _, tokens = stack
    monkeypatch.setattr(console, "MAX_STREAMS", 1)
    async with await client.get(f"{API}/stream", headers=bearer(tokens.operator)) as response:
        assert (await Events(response).next())[0] == "snapshot"
        second = await client.get(f"{API}/stream", headers=bearer(tokens.operator))
        assert second.status == 503 and second.headers["Retry-After"] == str(console.RETRY_AFTER_S)


async def test_the_stream_ends_cleanly_when_the_stack_stops(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = console_config(tmp_path)
    # Keep-alives and the grace far longer than the test's bound: only the shutdown hook can end the stream.
    async with running_stack(tmp_path, sse_keepalive=60, shutdown_grace=30) as (client, _):
        response = await http.get(f"{client.base}{API}/stream", headers=bearer(tokens.operator))
        events = Events(response)
        assert (await events.next())[0] == "snapshot"
        started = time.monotonic()
    assert await events.block() == b""  # a clean end of the chunked body, not a reset
    assert time.monotonic() - started < 5
    response.release()


async def test_the_daemon_exits_promptly_with_a_page_open(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = console_config(tmp_path)
    async with Daemon(tmp_path, "--sse-keepalive", "60", "--shutdown-grace", "30") as daemon:
        base = daemon.url.removesuffix("/mcp")
        page = await http.get(f"{base}/approvals")
        assert page.status == 200
        response = await http.get(f"{base}{API}/stream", headers=bearer(tokens.operator))
        events = Events(response)
        assert (await events.next())[0] == "snapshot"
        started = time.monotonic()
        assert await daemon.stop() == 0
        assert time.monotonic() - started < 5
        assert await events.block() == b""
        response.release()
