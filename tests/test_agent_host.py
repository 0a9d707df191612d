"""The host of what an ACP agent asks between its session's turns (gatewayd/agents.py `AgentHost.between_turns`):
it reaches the MCP session of the last turn's caller while that session lasts, decides in a context of that client
with no call in it, and does not keep the session alive once the gateway let it go."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from gatewayd.agents import AgentHost, Agents
from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.calls import Call, CallContext
from gatewayd.confirmation import ConfirmationGate
from gatewayd.metrics import Metrics
from gatewayd.policy import Principal
from gatewayd.records import Records
from gatewayd.sessions import Session
from tests.test_gateway import Scripted

LINE = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "built"}}


def turn_host(session: Session | None) -> AgentHost:
    """The host of a turn of client `laptop`, called in `session`."""
    records = Records(AuditLog(None), Metrics())
    ctx = CallContext(Principal("laptop"), {}, session, on_disconnect=lambda _gone: lambda: None)
    call = Call(ctx, "tools/call", 7, "coder.prompt", {}, {}, None)
    return AgentHost(Agents(records, ConfirmationGate(Approvals(), records)), ctx, Scripted("coder", ["prompt"]), call)


def session_of(client: str = "laptop") -> Session:
    return Session("s" * 43, client, "2025-11-25", {"elicitation": {}}, {})


async def test_between_turns_the_caller_s_session_hears_the_agent_while_it_lasts() -> None:
    session = session_of()
    later = turn_host(session).between_turns()
    told = later.tell(LINE)
    heard: Any = session.outbound.get_nowait()
    session.end()
    assert (told, heard["params"]["data"]) == (session.id, "built")
    assert later.tell(LINE) is None


async def test_between_turns_a_request_is_decided_for_the_client_with_no_call_in_its_context() -> None:
    session = session_of()
    later = turn_host(session).between_turns()
    ctx = later._context()
    # The caller's session is there to be asked on (its stream), nothing of the turn's request is.
    assert (ctx.principal.name, ctx.session, ctx.on_disconnect, dict(ctx.servers)) == ("laptop", session, None, {})
    assert ctx.emit == session.push
    session.end()
    assert (later._context().session, later._context().emit) == (None, None)
    # And without a session (a JSON caller's turn): the operators only.
    assert turn_host(None).between_turns()._context().session is None


async def test_between_turns_the_host_does_not_keep_the_caller_s_session_alive() -> None:
    session = session_of()
    later = turn_host(session).between_turns()
    gone = weakref.ref(session)
    del session
    gc.collect()
    assert gone() is None and later.tell(LINE) is None
