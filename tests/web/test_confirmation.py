"""The confirmation gate end to end, in-process on real sockets: each channel × each outcome, races, bounds.

Ground truth for "did it run" is the child: the fault fixture records every line it receives.
Operators answer on the real admin unix socket (AdminClient, as gatewayctl does); a client's user
answers an MCP elicitation on the call's SSE stream, POSTed back on its session.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatewayd.admin import AdminClient
from gatewayd.approvals import Approval, State
from gatewayd.errors import AuditUnavailable
from gatewayd.state import DaemonState
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import eventually

SPY = """
protocol = "jsonrpc"
max_in_flight = 128
[methods.echo]
confirm = true
"""
ROLES = """
[roles.agent]
allow = ["spy.*"]
[roles.hasty]
allow = ["spy.*"]
[roles.hasty.confirmation."spy.*"]
timeout = "300ms"
[roles.operators_only]
allow = ["spy.*"]
[roles.operators_only.confirmation."spy.*"]
channels = []
"""
CLIENTS = {"agent": ["agent"], "hasty": ["hasty"], "operators_only": ["operators_only"]}
ACCEPT_SSE = "application/json, text/event-stream"
# Rounds of each race: enough to catch an ordering bug, few enough to stay fast.
RACE_ROUNDS = 10
CONCURRENT_APPROVALS = 100


class Gate:
    """The gateway in-process, a recording child, a token per client and the operator's admin client."""

    def __init__(self, client: LocalClient, state: DaemonState, tokens: dict[str, str], record: Path) -> None:
        self.client = client
        self.state = state
        self.tokens = tokens
        self.record = record
        self.admin = AdminClient(state.settings.admin_socket_path() or Path("/nonexistent"))

    def runs(self) -> list[Any]:
        """Arguments of every echo the child received, in order."""
        if not self.record.exists():
            return []
        lines = self.record.read_text().split("\n")[:-1]  # only whole lines: the child may be mid-write
        return [m.get("params") for m in map(json.loads, filter(None, lines)) if m.get("method") == "echo"]

    def headers(self, who: str, session: str | None = None, accept: str = "application/json") -> dict[str, str]:
        extra = {"Mcp-Session-Id": session} if session else {}
        return headers(self.tokens[who], Accept=accept, **extra)

    async def call(self, who: str, arguments: dict[str, Any], http: aiohttp.ClientSession | None = None,
                   id: Any = 1) -> dict[str, Any]:
        """A direct JSON call of spy.echo; its JSON-RPC answer."""
        body = {"jsonrpc": "2.0", "id": id, "method": "spy.echo", "params": arguments}
        async with (http or self.client.session).post(self.client.base + "/mcp", json=body,
                                                      headers=self.headers(who)) as response:
            answer: dict[str, Any] = await response.json()
            return answer

    async def pending(self, count: int = 1) -> list[Approval]:
        await eventually(lambda: len(self.state.approvals) >= count, what=f"{count} pending approvals")
        return self.state.approvals.pending()

    async def decide(self, approval_id: str, verdict: str, reason: str | None = None) -> tuple[int, Any]:
        return await self.admin.call("POST", f"/approvals/{approval_id}/{verdict}",
                                     {"reason": reason} if reason else None)

    async def session(self, who: str, elicitation: bool) -> str:
        capabilities: dict[str, Any] = {"elicitation": {}} if elicitation else {}
        response = await self.client.post("/mcp", headers=self.headers(who), json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": who}}})
        return response.headers["Mcp-Session-Id"]

    async def answer(self, who: str, session: str, request_id: Any, result: dict[str, Any]) -> int:
        response = await self.client.post("/mcp", headers=self.headers(who, session),
                                          json={"jsonrpc": "2.0", "id": request_id, "result": result})
        return response.status


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[Gate]:
    record = tmp_path / "received.jsonl"
    tools = {"spy": python_command(str(FAULTSRV), "--record", str(record)) + SPY}
    tokens = write_config(tmp_path, tools, ROLES, CLIENTS)
    async with running_stack(tmp_path, client_max_concurrent=1000, client_rate=1e6, client_burst=10**6) as (
            client, state):
        yield Gate(client, state, tokens, record)


class Stream:
    """A tools/call answered as SSE, read event by event."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while True:
                line = await self.response.content.readline()
                assert line, "the stream ended"
                if line.startswith(b"data: "):
                    message: dict[str, Any] = json.loads(line[6:])
                    return message

    async def until(self, key: str, value: Any = None) -> dict[str, Any]:
        """The next message having `key` (equal to `value` when given); others are skipped."""
        while True:
            message = await self.next()
            if key in message and (value is None or message[key] == value):
                return message


async def sse_call(gate: Gate, who: str, session: str, arguments: dict[str, Any],
                   http: aiohttp.ClientSession | None = None) -> Stream:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "spy__echo", "arguments": arguments}}
    response = await (http or gate.client.session).post(gate.client.base + "/mcp", json=body,
                                                        headers=gate.headers(who, session, ACCEPT_SSE))
    assert response.status == 200 and response.content_type == "text/event-stream"
    return Stream(response)


# -- operators on the admin socket ---------------------------------------------------------------


async def test_operator_approval_runs_the_call_once(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "go"}))
    [approval] = await gate.pending()
    assert (approval.client, approval.method, approval.arguments) == ("agent", "spy.echo", {"text": "go"})
    assert gate.runs() == []  # nothing runs while it waits
    status, answer = await gate.decide(approval.id, "approve")
    assert status == 200 and answer["ok"] and answer["approval"]["decided_by"].startswith("operator uid ")
    assert (await call)["result"] == {"text": "go"}
    status, again = await gate.decide(approval.id, "approve")
    assert status == 409 and "already approved" in again["message"]
    assert gate.runs() == [{"text": "go"}]


async def test_operator_denial_reaches_the_caller_with_its_reason(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "no"}))
    [approval] = await gate.pending()
    status, _ = await gate.decide(approval.id, "deny", "not on a Friday")
    assert status == 200
    error = (await call)["error"]
    assert error["code"] == -32015 and error["data"]["error_type"] == "confirmation_denied"
    assert error["data"]["approval_id"] == approval.id and error["data"]["reason"] == "not on a Friday"
    assert gate.runs() == []


async def test_nobody_answering_expires_the_call(gate: Gate) -> None:
    answer = await gate.call("hasty", {"text": "late"})
    error = answer["error"]
    assert error["code"] == -32016 and error["data"]["retryable"] is True and error["data"]["approval_id"]
    status, late = await gate.decide(error["data"]["approval_id"], "approve")
    assert status == 409 and "already expired" in late["message"]
    assert gate.runs() == []


async def test_caller_disconnecting_withdraws_the_approval(gate: Gate) -> None:
    async with aiohttp.ClientSession() as http:
        call = asyncio.create_task(gate.call("agent", {"text": "bye"}, http))
        [approval] = await gate.pending()
    # Leaving the block closed the caller's connection.
    await eventually(lambda: approval.state is State.WITHDRAWN, what="withdrawn on disconnect")
    assert approval.reason == "the caller disconnected"
    with pytest.raises(aiohttp.ClientError):
        await call
    status, late = await gate.decide(approval.id, "approve")
    assert status == 409 and "withdrawn" in late["message"]
    assert gate.runs() == []


async def test_ending_the_session_withdraws_its_approvals(gate: Gate) -> None:
    session = await gate.session("agent", elicitation=False)
    stream = await sse_call(gate, "agent", session, {"text": "s"})
    [approval] = await gate.pending()
    response = await gate.client.delete("/mcp", headers=gate.headers("agent", session))
    assert response.status == 204
    answer = await stream.until("id", 7)
    assert answer["error"]["code"] == -32017 and "session ended" in answer["error"]["message"]
    assert approval.state is State.WITHDRAWN and gate.runs() == []


async def test_the_waiting_stream_says_where_to_approve(gate: Gate) -> None:
    session = await gate.session("agent", elicitation=False)
    stream = await sse_call(gate, "agent", session, {"text": "where"})
    notice = await stream.until("method", "notifications/message")
    data = notice["params"]["data"]
    [approval] = await gate.pending()
    assert data["event"] == "approval_pending" and data["approval_id"] == approval.id
    assert data["approve_with"] == f"gatewayctl approve {approval.id}"
    assert data["approval_page"] == f"http://127.0.0.1:{gate.client.port}/approvals"
    await gate.decide(approval.id, "approve")
    assert (await stream.until("id", 7))["result"]["structuredContent"] == {"text": "where"}


# -- the caller's own user, by elicitation -------------------------------------------------------


async def _elicited(gate: Gate, who: str = "agent") -> tuple[str, Stream, dict[str, Any]]:
    session = await gate.session(who, elicitation=True)
    stream = await sse_call(gate, who, session, {"text": "ask me"})
    request = await stream.until("method", "elicitation/create")
    return session, stream, request


async def test_elicitation_accept_runs_the_call(gate: Gate) -> None:
    session, stream, request = await _elicited(gate)
    params = request["params"]
    assert params["mode"] == "form" and params["requestedSchema"]["required"] == ["approve"]
    assert "agent" in params["message"] and "spy.echo" in params["message"] and "ask me" in params["message"]
    assert await gate.answer("agent", session, request["id"], {"action": "accept", "content": {"approve": True}}) == 202
    answer = await stream.until("id", 7)
    assert answer["result"]["structuredContent"] == {"text": "ask me"}
    assert gate.runs() == [{"text": "ask me"}]
    decided = gate.state.approvals.get(request["id"].removeprefix("gatewayd-approval-"))
    assert decided is not None and decided.channel == "client"
    assert "user of client agent" in (decided.decided_by or "")


@pytest.mark.parametrize("result", [
    {"action": "decline"},
    {"action": "cancel"},
    {"action": "accept", "content": {"approve": False}},
    {"action": "accept"},
    {"action": "whatever"},
])
async def test_elicitation_anything_but_yes_denies(gate: Gate, result: dict[str, Any]) -> None:
    session, stream, request = await _elicited(gate)
    assert await gate.answer("agent", session, request["id"], result) == 202
    answer = await stream.until("id", 7)
    assert answer["error"]["code"] == -32015
    assert gate.runs() == []


async def test_elicitation_error_answer_denies(gate: Gate) -> None:
    session, stream, request = await _elicited(gate)
    response = await gate.client.post("/mcp", headers=gate.headers("agent", session), json={
        "jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "no UI"}})
    assert response.status == 202
    assert (await stream.until("id", 7))["error"]["code"] == -32015


async def test_elicitation_unanswered_expires(gate: Gate) -> None:
    _, stream, _ = await _elicited(gate, "hasty")
    assert (await stream.until("id", 7))["error"]["code"] == -32016
    assert gate.runs() == []


async def test_elicitation_caller_disconnecting_withdraws(gate: Gate) -> None:
    async with aiohttp.ClientSession() as http:
        session = await gate.session("agent", elicitation=True)
        stream = await sse_call(gate, "agent", session, {"text": "gone"}, http)
        await stream.until("method", "elicitation/create")
        [approval] = await gate.pending()
    await eventually(lambda: approval.state is State.WITHDRAWN, what="withdrawn on disconnect")
    assert gate.runs() == []


async def test_an_answer_from_another_session_is_ignored(gate: Gate) -> None:
    session, stream, request = await _elicited(gate)
    other = await gate.session("agent", elicitation=True)
    yes = {"action": "accept", "content": {"approve": True}}
    assert await gate.answer("agent", other, request["id"], yes) == 202
    [approval] = gate.state.approvals.pending()
    assert approval.state is State.PENDING  # still waiting: that answer was not for this session
    assert await gate.answer("agent", session, request["id"], yes) == 202
    assert "result" in await stream.until("id", 7)


async def test_policy_without_the_client_channel_asks_operators_only(gate: Gate) -> None:
    session = await gate.session("operators_only", elicitation=True)
    stream = await sse_call(gate, "operators_only", session, {"text": "ops"})
    notice = await stream.until("method", "notifications/message")
    [approval] = await gate.pending()
    assert approval.channels == {"gatewayctl"} and "approval_page" not in notice["params"]["data"]
    await gate.decide(approval.id, "approve")
    # The next message is the result: no elicitation was sent.
    answer = await stream.next()
    assert answer.get("id") == 7 and "result" in answer


async def test_json_callers_are_never_elicited(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "json"}))
    [approval] = await gate.pending()
    assert approval.channels == {"gatewayctl", "web"}  # the client channel needs an SSE stream and the capability
    await gate.decide(approval.id, "approve")
    assert "result" in await call


# -- single use, races, bounds -------------------------------------------------------------------


async def test_each_call_needs_its_own_approval_even_with_the_same_arguments(gate: Gate) -> None:
    first = asyncio.create_task(gate.call("agent", {"text": "same"}, id="first"))
    [a] = await gate.pending()
    second = asyncio.create_task(gate.call("agent", {"text": "same"}, id="second"))
    await gate.pending(2)
    [b] = [x for x in gate.state.approvals.pending() if x is not a]
    assert a.id != b.id and a.params_sha256 == b.params_sha256
    await gate.decide(a.id, "approve")
    assert (await first)["id"] == "first" and "result" in await first
    assert b.state is State.PENDING and len(gate.runs()) == 1
    await gate.decide(b.id, "deny")
    assert (await second)["error"]["code"] == -32015
    assert gate.runs() == [{"text": "same"}]


async def test_approve_and_deny_racing_exactly_one_wins(gate: Gate) -> None:
    approved = 0
    for round_ in range(RACE_ROUNDS):
        call = asyncio.create_task(gate.call("agent", {"round": round_}))
        [approval] = await gate.pending()
        (s1, yes), (s2, no) = await asyncio.gather(gate.decide(approval.id, "approve"),
                                                   gate.decide(approval.id, "deny"))
        assert sorted([s1, s2]) == [200, 409] and yes["ok"] != no["ok"]
        answer = await call
        assert ("result" in answer) == yes["ok"]
        approved += yes["ok"]
        await eventually(lambda: len(gate.state.approvals) == 0, what="approval finished")
    assert len(gate.runs()) == approved


async def test_approve_racing_the_timeout_exactly_one_wins(gate: Gate) -> None:
    loop = asyncio.get_running_loop()
    ran = 0
    for round_ in range(RACE_ROUNDS):
        call = asyncio.create_task(gate.call("hasty", {"round": round_}))
        [approval] = await gate.pending()
        # Aim the operator's answer at the deadline itself, from either side of it.
        at = loop.time() + approval.deadline - time.time() + (0.002 if round_ % 2 else -0.002)
        decided = asyncio.create_task(_approve_at(gate, approval.id, at))
        answer = await call
        status, body = await decided
        if "result" in answer:
            ran += 1
            assert status == 200 and body["ok"]
        else:
            assert answer["error"]["code"] == -32016 and status == 409 and "expired" in body["message"]
    assert len(gate.runs()) == ran


async def _approve_at(gate: Gate, approval_id: str, when: float) -> tuple[int, Any]:
    due = asyncio.Event()
    asyncio.get_running_loop().call_at(when, due.set)
    await due.wait()
    return await gate.decide(approval_id, "approve")


async def test_a_hundred_calls_wait_at_once_and_each_runs_once(gate: Gate) -> None:
    calls = [asyncio.create_task(gate.call("agent", {"n": n}, id=n)) for n in range(CONCURRENT_APPROVALS)]
    pending = await gate.pending(CONCURRENT_APPROVALS)
    status, listed = await gate.admin.call("GET", "/approvals")
    assert status == 200 and len(listed["approvals"]) == CONCURRENT_APPROVALS
    results = await asyncio.gather(*(gate.decide(a.id, "approve") for a in pending))
    assert all(status == 200 for status, _ in results)
    answers = await asyncio.gather(*calls)
    assert sorted(a["result"]["n"] for a in answers) == list(range(CONCURRENT_APPROVALS))
    assert sorted(r["n"] for r in gate.runs()) == list(range(CONCURRENT_APPROVALS))


async def test_too_many_pending_are_refused_as_overloaded(gate: Gate) -> None:
    gate.state.approvals.max_pending = 1
    first = asyncio.create_task(gate.call("agent", {"text": 1}))
    [approval] = await gate.pending()
    answer = await gate.call("agent", {"text": 2}, id=2)
    assert answer["error"]["code"] == -32014
    await gate.decide(approval.id, "deny")
    assert (await first)["error"]["code"] == -32015


async def test_shutdown_withdraws_pending_approvals(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "stop"}))
    [approval] = await gate.pending()
    await gate.state.inflight.drain(0.1)
    answer = await call
    assert answer["error"]["code"] == -32011 and approval.state is State.WITHDRAWN and gate.runs() == []


# -- the audit trail -----------------------------------------------------------------------------


async def test_audit_records_request_decision_approver_and_outcome_in_order(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "audited"}))
    [approval] = await gate.pending()
    await gate.decide(approval.id, "approve")
    await call
    await gate.state.audit.flush()
    path = gate.state.settings.audit_file()
    assert path is not None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    mine = [r for r in records if r.get("approval_id") == approval.id or r.get("trace_id") == records[-1]["trace_id"]]
    assert [r["event"] for r in mine] == ["decision", "approval_requested", "approval_decided", "outcome"]
    decision, requested, decided, outcome = mine
    assert decision["decision"] == "confirm" and requested["params_sha256"] == approval.params_sha256
    assert decided["state"] == "approved" and decided["decided_by"].startswith("operator uid ")
    assert decided["channel"] == "gatewayctl" and outcome["status"] == "ok"


async def test_a_notification_that_needs_confirmation_never_runs(gate: Gate) -> None:
    response = await gate.client.post("/mcp", headers=gate.headers("agent"),
                                      json={"jsonrpc": "2.0", "method": "spy.echo", "params": {"text": "sneak"}})
    assert response.status == 202
    # Then a request, so the child has certainly read anything sent before it.
    call = asyncio.create_task(gate.call("agent", {"text": "asked"}))
    [approval] = await gate.pending()
    await gate.decide(approval.id, "approve")
    await call
    assert gate.runs() == [{"text": "asked"}]


async def test_an_approval_that_cannot_be_audited_is_never_left_pending(gate: Gate) -> None:
    audit_log = gate.state.audit
    real_record = audit_log.record

    async def disk_fills_up(event: dict[str, Any], *, durable: bool) -> None:
        # Fault injection: the disk fills between the decision record and the approval's own record.
        if event["event"] == "approval_requested":
            raise AuditUnavailable("the audit log cannot record this call, so it was not run", {"reason": "ENOSPC"})
        await real_record(event, durable=durable)

    audit_log.record = disk_fills_up  # type: ignore[method-assign]
    answer = await gate.call("agent", {"text": "unrecorded"})
    assert answer["error"]["code"] == -32013
    assert len(gate.state.approvals) == 0 and gate.runs() == []


async def test_allow_again_runs_the_very_same_call_without_asking_until_revoked(gate: Gate) -> None:
    first = asyncio.create_task(gate.call("agent", {"text": "again"}))
    [approval] = await gate.pending()
    status, answer = await gate.admin.call("POST", f"/approvals/{approval.id}/approve", {"allow_again_for": 60})
    assert status == 200 and "again for 60s" in answer["message"]
    assert "result" in await first
    # The very same call now runs at once; the approval it got is recorded as standing.
    assert (await gate.call("agent", {"text": "again"}, id=2))["result"] == {"text": "again"}
    assert len(gate.state.approvals) == 0
    status, listed = await gate.admin.call("GET", "/approvals")
    assert [item["approval_id"] for item in listed["standing"]] == [approval.id]
    # Other arguments, or another client, are asked again.
    other = asyncio.create_task(gate.call("agent", {"text": "different"}, id=3))
    [waiting] = await gate.pending()
    await gate.decide(waiting.id, "deny")
    assert (await other)["error"]["code"] == -32015
    status, _ = await gate.admin.call("DELETE", f"/approvals/{approval.id}/standing")
    assert status == 200
    after = asyncio.create_task(gate.call("agent", {"text": "again"}, id=4))
    [asked] = await gate.pending()
    await gate.decide(asked.id, "deny")
    assert (await after)["error"]["code"] == -32015
    assert gate.runs() == [{"text": "again"}, {"text": "again"}]
    await gate.state.audit.flush()
    path = gate.state.settings.audit_file()
    assert path is not None
    decided = [json.loads(line) for line in path.read_text().splitlines() if '"approval_decided"' in line]
    assert [d["channel"] for d in decided] == ["gatewayctl", "standing", "gatewayctl", "gatewayctl"]
    assert approval.id in decided[1]["reason"]


async def test_allow_again_must_be_a_bounded_number_when_approving(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "bounded"}))
    [approval] = await gate.pending()
    for body in ({"allow_again_for": 7200}, {"allow_again_for": "10m"}, {"allow_again_for": True},
                 {"allow_again_for": 0}):
        status, _ = await gate.admin.call("POST", f"/approvals/{approval.id}/approve", body)
        assert status == 400
    status, _ = await gate.admin.call("POST", f"/approvals/{approval.id}/deny", {"allow_again_for": 60})
    assert status == 400 and approval.state is State.PENDING
    await gate.decide(approval.id, "approve")
    assert "result" in await call


async def test_drain_returns_once_calls_in_flight_finish_within_the_grace(gate: Gate) -> None:
    call = asyncio.create_task(gate.call("agent", {"text": "last"}))
    [approval] = await gate.pending()
    await gate.decide(approval.id, "approve")
    # The call may still be finishing; draining with room to spare must simply wait for it.
    await gate.state.inflight.drain(5.0)
    assert "result" in await call
