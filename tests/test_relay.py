"""relay.py: a tool server's requests during a call put to its caller, and every way one ends answering the child.

In memory: a CallContext with a real Session, an emit that records what the client is sent, and a future standing
for the call pending on the child. The child's side is the list of replies `reply` was given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.jsonrpc import Response
from gatewayd.metrics import Metrics
from gatewayd.policy import Principal
from gatewayd.records import Records
from gatewayd.relay import BAD_PARAMS, ENDED, MAX_RELAYED_PER_CALL, REFUSED, RELAY_ID_PREFIX, TIMED_OUT, Relay
from gatewayd.sessions import Session
from gatewayd.upstream.hosted import HostedTasks

pytestmark = pytest.mark.asyncio

ALL = ("sampling", "elicitation", "roots")
DECLARED = {"sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": True}}
# A sampling request as a child sends it: what the client is shown, and the child's own `_meta`.
SAMPLING = {"messages": [], "maxTokens": 5}


@dataclass
class Rig:
    relay: Relay
    trail: Path
    audit: AuditLog
    sent: list[dict[str, Any]] = field(default_factory=list)  # to the client
    replies: list[dict[str, Any]] = field(default_factory=list)  # to the child
    gone: list[Callable[[], None]] = field(default_factory=list)
    session: Session = field(default_factory=lambda: Session("s" * 43, "laptop", "2025-11-25", dict(DECLARED), {}))

    def ctx(self) -> CallContext:
        def on_disconnect(callback: Callable[[], None]) -> Callable[[], None]:
            self.gone.append(callback)
            return lambda: self.gone.remove(callback) if callback in self.gone else None
        return CallContext(Principal("laptop"), {}, session=self.session, emit=self.sent.append,
                           on_disconnect=on_disconnect)

    def reply(self, message: dict[str, Any]) -> bool:
        self.replies.append(message)
        return True

    def ask(self, method: str, call: asyncio.Future[Any], allowed: tuple[str, ...] = ALL,
            params: Any = None) -> dict[str, Any] | None:
        message = {"jsonrpc": "2.0", "id": "child-1", "method": method,
                   "params": params if params is not None else {**SAMPLING, "_meta": {"progressToken": 3}}}
        return self.relay.ask(self.ctx(), "srv", allowed, message, call, self.reply)

    async def records(self) -> list[dict[str, Any]]:
        await self.audit.flush()
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    try:
        yield Rig(Relay(Records(audit_log, Metrics()), timeout=0.2), trail, audit_log)
    finally:
        await audit_log.close()


def future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_answer_reaches_the_child_under_its_own_id(rig: Rig) -> None:
    assert rig.ask("sampling/createMessage", future()) is None
    [asked] = rig.sent
    assert asked["method"] == "sampling/createMessage" and asked["id"].startswith(RELAY_ID_PREFIX)
    assert asked["params"] == SAMPLING, "the child's _meta stays with the child"
    assert rig.relay.answer(rig.ctx(), Response(asked["id"], {"role": "assistant"}, None))
    assert rig.replies == [{"jsonrpc": "2.0", "id": "child-1", "result": {"role": "assistant"}}]
    assert len(rig.relay) == 0
    # A second answer is the relay's to drop (not the approval question's), and the child has had its one.
    assert rig.relay.answer(rig.ctx(), Response(asked["id"], {}, None))
    assert len(rig.replies) == 1
    [record] = await rig.records()
    assert record["event"] == "relayed" and record["server"] == "srv" and record["kind"] == "sampling"
    assert record["client"] == "laptop" and record["outcome"] == "answered"
    # Summarized (audit.summarize), which redacts any key naming a token, `maxTokens` too.
    assert record["params"] == {"messages": [], "maxTokens": "[redacted]", "_meta": {"progressToken": "[redacted]"}}


async def test_a_client_error_reaches_the_child(rig: Rig) -> None:
    rig.ask("roots/list", future())
    error = {"code": -32603, "message": "no"}
    assert rig.relay.answer(rig.ctx(), Response(rig.sent[0]["id"], None, error))
    assert rig.replies == [{"jsonrpc": "2.0", "id": "child-1", "error": error}]


async def test_another_session_cannot_answer(rig: Rig) -> None:
    rig.ask("roots/list", future())
    other = CallContext(Principal("laptop"), {}, session=Session("t" * 43, "laptop", "2025-11-25", {}, {}))
    assert rig.relay.answer(other, Response(rig.sent[0]["id"], {}, None)), "dropped by the relay"
    assert rig.replies == [] and len(rig.relay) == 1
    # The session it was put to still answers it.
    assert rig.relay.answer(rig.ctx(), Response(rig.sent[0]["id"], {"roots": []}, None))
    assert rig.replies == [{"jsonrpc": "2.0", "id": "child-1", "result": {"roots": []}}]


async def test_an_answer_to_an_id_never_relayed_is_dropped_and_others_are_not_the_relays(rig: Rig) -> None:
    assert rig.relay.answer(rig.ctx(), Response(RELAY_ID_PREFIX + "999", {}, None))
    assert not rig.relay.answer(rig.ctx(), Response("gatewayd-approval-1", {}, None)), "the approval question's"
    assert not rig.relay.answer(rig.ctx(), Response(7, {}, None))
    assert rig.replies == []


@pytest.mark.parametrize(("method", "params"), [
    ("sampling/createMessage", ["not", "an", "object"]),
    ("sampling/createMessage", {"maxTokens": 5}),
    ("sampling/createMessage", {"messages": [], "maxTokens": "5"}),
    ("elicitation/create", {"requestedSchema": {"type": "object"}}),
    ("elicitation/create", {"message": "m", "mode": "telepathy"}),
    ("elicitation/create", {"message": "m", "mode": "form"}),
    ("roots/list", "everything"),
])
async def test_bad_params_are_refused_to_the_child_at_once(rig: Rig, method: str, params: Any) -> None:
    refusal = rig.ask(method, future(), ALL, params)
    assert refusal is not None and refusal["id"] == "child-1" and refusal["error"]["code"] == BAD_PARAMS
    assert rig.sent == [] and len(rig.relay) == 0
    [record] = await rig.records()
    assert record["outcome"] == "bad_params"


async def test_a_call_flooding_its_caller_is_refused_past_its_limit_and_others_are_not(rig: Rig) -> None:
    flooding, other = future(), future()
    for _ in range(MAX_RELAYED_PER_CALL):
        assert rig.ask("roots/list", flooding) is None
    refusal = rig.ask("roots/list", flooding)
    assert refusal is not None and refusal["error"]["code"] == REFUSED
    assert "already wait for its caller" in refusal["error"]["message"]
    assert len(rig.sent) == MAX_RELAYED_PER_CALL
    assert rig.ask("roots/list", other) is None, "another call is not held back"
    # One answered: room for one more of the flooding call.
    assert rig.relay.answer(rig.ctx(), Response(rig.sent[0]["id"], {"roots": []}, None))
    assert rig.ask("roots/list", flooding) is None
    flooding.set_result({})
    await settle()
    assert rig.ask("roots/list", other) is None
    assert len(rig.relay) == 2


@pytest.mark.parametrize(("method", "allowed", "params", "outcome"), [
    ("sampling/createMessage", ("roots",), None, "not_allowed"),
    ("sampling/createMessage", (), None, "not_allowed"),
    ("elicitation/create", ALL, {"mode": "url", "url": "https://x", "message": "m", "elicitationId": "e"},
     "not_declared"),
    ("resources/list", ALL, None, "not_relayable"),
])
async def test_refusals_answer_the_child_at_once(rig: Rig, method: str, allowed: tuple[str, ...], params: Any,
                                                 outcome: str) -> None:
    refusal = rig.ask(method, future(), allowed, params)
    assert refusal is not None and refusal["id"] == "child-1" and refusal["error"]["code"] == REFUSED
    assert rig.sent == [] and len(rig.relay) == 0
    [record] = await rig.records()
    assert record["outcome"] == outcome and record["request_id"] is None


async def test_a_capability_the_session_did_not_declare_is_refused(rig: Rig) -> None:
    rig.session.capabilities.pop("sampling")
    refusal = rig.ask("sampling/createMessage", future())
    assert refusal is not None and refusal["error"]["code"] == REFUSED


async def test_a_finished_call_is_refused(rig: Rig) -> None:
    call = future()
    call.set_result({})
    refusal = rig.ask("roots/list", call)
    assert refusal is not None and refusal["error"]["code"] == REFUSED


async def test_timeout_answers_the_child_and_withdraws_the_question(rig: Rig) -> None:
    rig.ask("elicitation/create", future(), params={"message": "m", "requestedSchema": {"type": "object"}})
    await asyncio.sleep(0.4)
    [reply] = rig.replies
    assert reply["id"] == "child-1" and reply["error"]["code"] == TIMED_OUT
    asked, cancelled = rig.sent
    assert cancelled == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                         "params": {"requestId": asked["id"], "reason": "timeout"}}
    assert len(rig.relay) == 0


@pytest.mark.parametrize("ending", ["call_answered", "call_cancelled", "call_failed", "disconnected",
                                    "session_ended"])
async def test_every_ending_answers_the_child_with_an_error(rig: Rig, ending: str) -> None:
    call = future()
    rig.ask("sampling/createMessage", call)
    if ending == "call_answered":
        call.set_result({"content": []})
    elif ending == "call_cancelled":
        call.cancel()
    elif ending == "call_failed":
        call.set_exception(RuntimeError("the child exited"))
    elif ending == "disconnected":
        for callback in list(rig.gone):
            callback()
    else:
        rig.session.end()
    await settle()
    [reply] = rig.replies
    assert reply["id"] == "child-1" and reply["error"]["code"] == ENDED
    assert len(rig.relay) == 0 and rig.gone == []
    outcome = {"disconnected": "disconnected", "session_ended": "session_ended"}.get(ending, "call_finished")
    [record] = await rig.records()
    assert record["outcome"] == outcome
    if ending != "session_ended":
        # A client that lost its connection hears it too, if it takes its call's stream up again (resumable.py).
        assert rig.sent[-1]["method"] == "notifications/cancelled"
    # Nothing fires twice: the timer was cancelled with the rest.
    await asyncio.sleep(0.3)
    assert len(rig.replies) == 1


async def test_two_requests_of_one_session_both_end_with_it(rig: Rig) -> None:
    rig.ask("sampling/createMessage", future())
    rig.ask("roots/list", future())
    first, second = rig.sent
    assert first["id"] != second["id"]
    rig.session.end()
    await settle()
    assert len(rig.replies) == 2 and len(rig.relay) == 0


async def test_relay_ids_never_look_like_approval_ids(rig: Rig) -> None:
    rig.ask("roots/list", future())
    assert not rig.sent[0]["id"].startswith("gatewayd-approval-")


async def test_a_per_session_child_s_request_outside_any_call_goes_to_its_session_s_stream(rig: Rig) -> None:
    asker = rig.relay.session_caller(rig.ctx())
    assert asker is not None
    message = {"jsonrpc": "2.0", "id": "child-9", "method": "roots/list", "params": {}}
    assert asker.ask("srv", ALL, message, None, rig.reply) is None
    # Not on the call's stream: on the session's own (its GET stream's queue).
    assert rig.sent == []
    asked = rig.session.outbound.get_nowait()
    assert asked is not None and asked["method"] == "roots/list"
    assert rig.relay.answer(rig.ctx(), Response(asked["id"], {"roots": []}, None))
    assert rig.replies == [{"jsonrpc": "2.0", "id": "child-9", "result": {"roots": []}}]
    # And the session's end ends one that nobody answered.
    asker.ask("srv", ALL, {**message, "id": "child-10"}, None, rig.reply)
    rig.session.end()
    await settle()
    assert rig.replies[-1]["id"] == "child-10" and rig.replies[-1]["error"]["code"] == -32000


async def test_a_hosted_task_the_child_cancels_withdraws_its_question_from_the_client(rig: Rig) -> None:
    call, table = future(), HostedTasks(rig.reply)

    def ask(plain: dict[str, Any], reply: Callable[[dict[str, Any]], bool],
            withdrawn: asyncio.Future[None] | None) -> dict[str, Any] | None:
        return rig.relay.ask(rig.ctx(), "srv", ALL, plain, call, reply, withdrawn)

    created = table.take({"jsonrpc": "2.0", "id": "child-1", "method": "sampling/createMessage",
                          "params": {**SAMPLING, "task": {"ttl": 60000}}}, ask)
    assert created is not None
    task_id = created["result"]["task"]["taskId"]
    [asked] = rig.sent
    cancel = table.answer({"jsonrpc": "2.0", "id": "child-2", "method": "tasks/cancel", "params": {"taskId": task_id}})
    assert cancel is not None and cancel["result"]["status"] == "cancelled"
    await settle()
    # The client may close its question: the tool server no longer wants the answer.
    assert rig.sent[1:] == [{"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": asked["id"], "reason": "withdrawn"}}]
    assert len(rig.relay) == 0 and rig.replies == []  # the child asked to cancel: nothing more is written to it
    # An answer that comes after all is dropped, and changes nothing.
    assert rig.relay.answer(rig.ctx(), Response(asked["id"], {"role": "assistant"}, None))
    assert rig.replies == []
    [record] = await rig.records()
    assert record["outcome"] == "withdrawn" and record["kind"] == "sampling"
