"""Forward: an authorized call to its tool server, and the server's notifications about it back to the caller.

Owns which of the server's entry points a route uses (`tools/call` → a tool call answered as an MCP
result; a direct `server.method` → the server's own result; a notification → a notification), sending
exactly the arguments that were decided, shown to a person, hashed and audited (never the caller's
own `_meta`, which only says how to deliver), and
mapping the child's notifications about the call to the caller's: progress under the caller's own
progress token (only when it asked for progress), log lines through the session's log level. Does
not own how each protocol is spoken (upstream/dialects.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gatewayd.calls import TOOLS_CALL, Call, CallContext, Target
from gatewayd.upstream.api import Delivery, EventSink


async def forward(call: Call, target: Target, still_allowed: Callable[[], None] | None) -> Any:
    """Send the call to its server (once `still_allowed` passes, if given) and return what the caller is
    answered with."""
    on_event, progress = _event_mapper(call.ctx, call.meta)
    delivery = Delivery(call.ctx.principal.name, on_event, progress, still_allowed)
    if call.route == TOOLS_CALL:
        return await target.server.call_tool(target.method, call.arguments, delivery)
    return await target.server.call_method(target.method, call.arguments, delivery)


async def send(call: Call, target: Target, still_allowed: Callable[[], None] | None) -> bool:
    """Send a notification to its server; False when the server's protocol has no fire-and-forget call."""
    delivery = Delivery(call.ctx.principal.name, still_allowed=still_allowed)
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

    return forward_event, token is not None
