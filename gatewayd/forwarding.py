"""Forward: an authorized call to its tool server, and the server's notifications about it back to the caller.

Owns which of the server's entry points a route uses (`tools/call` → a tool call answered as an MCP
result; a direct `server.method` → the server's own result; a notification → a notification), sending
exactly the arguments that were decided, shown to a person, hashed and audited (never the caller's
own `_meta`, which only says how to deliver); what the caller's `_meta` says about delivery: its
deadline (`io.gatewayd/timeoutMs`, which bounds the call together with the configured timeout, the
smaller winning) and its trace context (`traceparent`/`tracestate`, or the gateway's own trace id,
passed to the child in `_meta` on every route); and mapping the child's notifications about the call
to the caller's: progress under the caller's own progress token (only when it asked for progress),
log lines through the session's log level; and who the child's own requests during the call are put to
(the caller, through relay.py; for a per-session child, outside calls too: its session's client). Does not
own how each protocol is spoken (upstream/dialects.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gatewayd import jsontext
from gatewayd.calls import TOOLS_CALL, Call, CallContext, Target
from gatewayd.errors import CallTimedOut
from gatewayd.relay import Relay
from gatewayd.upstream.api import Delivery, EventSink

if TYPE_CHECKING:
    from gatewayd.agents import Agents

# The `_meta` key of a caller's own deadline for a call, in milliseconds from when the gateway received it.
TIMEOUT_KEY = "io.gatewayd/timeoutMs"


async def forward(call: Call, target: Target, still_allowed: Callable[[], None] | None,
                  relay: Relay | None = None, agents: Agents | None = None) -> Any:
    """Send the call to its server (once `still_allowed` passes, if given) and return what the caller is
    answered with; the server's own requests meanwhile go to the caller through `relay`, or, for an agent, are
    answered through `agents`."""
    on_event, progress = _event_mapper(call.ctx, call.meta)
    budget = _caller_budget(call)
    ctx, server = call.ctx, target.server
    # A caller without a session (MCP 2026-07-28) brings its own asker (modern.py); others are asked through the relay.
    caller = ctx.asker if ctx.asker is not None else relay.caller(ctx) if relay is not None else None
    # A per-session child asks its session's client outside calls too (fleet.py); nobody else needs that asker.
    owner = relay.session_caller(ctx) if relay is not None and server.isolation == "session" else None
    host = agents.host(call, server) if agents is not None and server.protocol == "acp" else None
    delivery = Delivery(ctx.principal.name, on_event, progress, still_allowed, caller, timeout=budget,
                        trace=call.trace_context, task=_task(call), session=ctx.session, owner=owner, host=host,
                        # A modern caller's retry brings its answers (modern.Asker); what any caller can be asked is
                        # read from it only for a modern child (dialects.py).
                        resume=getattr(caller, "resume", None),
                        large=ctx.large and jsontext.carries_large_string(call.arguments))
    try:
        if call.route == TOOLS_CALL:
            return await target.server.call_tool(target.method, call.arguments, delivery)
        if target.surface:
            # A resource, prompt or completion request, or a task's follow-up (tasks.py): the route is the MCP method
            # the server is sent.
            sent = call.arguments if call.sent is None else call.sent
            return await target.server.call_surface(call.route, sent, delivery)
        return await target.server.call_method(target.method, call.arguments, delivery)
    except CallTimedOut as exc:
        if budget is not None:
            # How much of the caller's own deadline was left when the call gave up (0: it was the caller's).
            exc.data["remaining_ms"] = max(0, round(_deadline_ms(call) - time.monotonic() * 1000))
        raise


def _task(call: Call) -> dict[str, Any] | None:
    """A task-augmented `tools/call`'s `task` (tasks.py): how to run the call, not what it does."""
    task = call.params.get("task") if call.route == TOOLS_CALL and isinstance(call.params, dict) else None
    return task if isinstance(task, dict) else None


def _caller_budget(call: Call) -> float | None:
    """Seconds left of the caller's `_meta` deadline, or None if it gave none (a bad value is ignored)."""
    meta = call.meta
    wanted = meta.get(TIMEOUT_KEY) if isinstance(meta, dict) else None
    if isinstance(wanted, bool) or not isinstance(wanted, int | float) or not math.isfinite(wanted) or wanted <= 0:
        return None
    return max(0.0, _deadline_ms(call) / 1000 - time.monotonic())


def _deadline_ms(call: Call) -> float:
    wanted = call.meta[TIMEOUT_KEY]
    return float(call.started * 1000 + wanted)


async def send(call: Call, target: Target, still_allowed: Callable[[], None] | None) -> bool:
    """Send a notification to its server; False when the server's protocol has no fire-and-forget call."""
    ctx = call.ctx
    delivery = Delivery(ctx.principal.name, still_allowed=still_allowed, session=ctx.session,
                        large=ctx.large and jsontext.carries_large_string(call.arguments))
    return await target.server.notify(target.method, call.arguments, delivery)


def _event_mapper(ctx: CallContext, meta: Any) -> tuple[EventSink | None, bool]:
    """A sink that turns a child's notifications into the caller's, and whether progress was asked for."""
    emit = ctx.emit
    if emit is None:
        return None, False
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    session = ctx.session

    def forward_event(message: dict[str, Any]) -> None:
        params = message.get("params")
        if not isinstance(params, dict):
            return
        if message.get("method") == "notifications/progress":
            if token is not None:
                mapped = {**params, "progressToken": token}
                emit({"jsonrpc": "2.0", "method": "notifications/progress", "params": mapped})
        elif message.get("method") == "notifications/message":
            if session is None or session.wants_log(params.get("level")):
                emit({"jsonrpc": "2.0", "method": "notifications/message", "params": params})
        elif message.get("method") == "session/update":
            # An ACP agent's update of a turn its caller runs directly (upstream/acp.py): passed on as it is.
            emit({"jsonrpc": "2.0", "method": "session/update", "params": params})

    return forward_event, token is not None
