"""One call on its way through the pipeline (gateway.py): who asks, how, and for what.

Owns `CallContext` (the caller: its principal, the tool servers of the config generation read
when its HTTP request began, how to look up its permissions in the generation current now, its
session, where the call's notifications go and how to learn that the caller went away), `Call`
(one request or notification as every step sees it: route, id, the name as the caller spelled
it, the canonical method once routed, the arguments rules see, and the audit fields the steps
share) and `Target` (one tool server and one of its methods). Does not own any step itself.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatewayd import audit
from gatewayd.policy import Principal
from gatewayd.sessions import SESSION_ID_SHOWN, Session
from gatewayd.upstream.api import Caller, Upstream
from gatewayd.values import value

# How a call reached the gateway, as the audit log names it.
DIRECT = "direct"
TOOLS_CALL = "tools/call"
# A JSON-RPC notification (no id): no answer, not even an error.
NOTIFICATION = "notification"
# A caller's `tracestate` longer than this is not passed on (the W3C limit is 512 characters).
TRACESTATE_MAX_CHARS = 512

Emit = Callable[[dict[str, Any]], None]
# Registers a callback for when the caller's connection goes away; returns a function that unregisters it.
OnDisconnect = Callable[[Callable[[], None]], Callable[[], None]]
# A client's principal in the config generation current now; None once a reload removed the client.
Authority = Callable[[str], Principal | None]


@dataclass
class CallContext:
    """Who is calling, with which tool servers (its request's config generation, kept to its end), in which
    session, where the call's notifications go (None: nowhere), how to learn that the caller went away
    (None: never known), how to look up what the client may do now (None: `principal` stays right), and who the
    server's own requests go to without a session."""

    principal: Principal
    servers: Mapping[str, Upstream]
    session: Session | None = None
    emit: Emit | None = None
    on_disconnect: OnDisconnect | None = None
    authority: Authority | None = None
    # Who made the call on the client's behalf (`gatewayctl call`: the operator), for the audit log; None: the client.
    operator: str | None = None
    # Who the call's server's own requests are put to when the caller has no session to be asked on (MCP 2026-07-28,
    # modern.py); None: the relay decides (relay.py).
    asker: Caller | None = None
    # Told the call and its "still allowed?" check once it is decided (None: nobody asks again): a modern call that
    # outlives its request (continuations.py) is decided again on each retry that resumes it.
    on_decided: Callable[[Call, Callable[[], None] | None], None] | None = None
    # Its request's body is over jsontext.LARGE_STRING bytes, so its arguments may hold a string that long: only then
    # are they looked through for one (forwarding.py). A shorter body cannot hold one.
    large: bool = False
    # MCP 2026-07-28 only: whether the caller declared the tasks extension in this request (modern_tasks.py); None for
    # a legacy or direct caller, whom the gateway never answers with a task.
    tasks: bool | None = None

    def current_principal(self) -> Principal | None:
        """The client's principal in the config generation current now (a reload may have changed or removed it
        since the request's token was checked)."""
        if self.authority is None:
            return self.principal
        return self.authority(self.principal.name)


@value
class Target:
    """A canonical call target: one tool server and one of its methods (for a `surface` target — a resource,
    prompt or completion route, surfaces.py — the method it is decided as, `resources/read` …, whose existence
    routing has already established)."""

    server: Upstream
    method: str
    surface: bool = False

    @property
    def canonical(self) -> str:
        """`server.method`, the name policies match."""
        return f"{self.server.name}.{self.method}"


@dataclass
class Call:
    """One call on its way through: who, by which route, for what, and what the audit log says about it.

    `name` is the method or tool name as the caller sent it; `method` becomes the canonical `server.method`
    once routed. `params` are the request's params as parsed; `arguments` what policy rules see of them.
    """

    ctx: CallContext
    route: str
    request_id: Any
    name: str
    params: Any
    arguments: Any
    meta: Any
    method: str = ""
    started: float = field(default_factory=time.monotonic)
    trace: str = ""
    # What the server is sent when it is not `arguments` (a task's follow-up, tasks.py, is decided with the
    # arguments of the call that created the task, and sends the child's task id).
    sent: Any = None
    _params_sha256: str | None = None
    # An ordinary call's "allow" decision (its fields), not yet written: its outcome record carries it (records.py).
    allowed: dict[str, Any] | None = None
    # Whether the call may become a task of its modern caller, as its tool's tools.d `task` says (set once routed).
    task_mode: str = "never"

    def __post_init__(self) -> None:
        if not self.method:
            self.method = self.name

    def params_sha256(self, flat: bool = False) -> str:
        """The arguments' hash, computed once: the decision record and an approval both carry it. `flat`: as for
        audit.params_hash."""
        if self._params_sha256 is None:
            self._params_sha256 = audit.params_hash(self.arguments, flat)
        return self._params_sha256

    def trace_context(self) -> dict[str, Any]:
        """The W3C trace context a child is sent: the caller's, if well formed, else a traceparent made from the
        trace id this call's audit records carry."""
        meta = self.meta if isinstance(self.meta, dict) else {}
        parent = meta.get("traceparent")
        if isinstance(parent, str) and audit.trace_id(meta) == parent[3:35]:
            out: dict[str, Any] = {"traceparent": parent}
            state = meta.get("tracestate")
            if isinstance(state, str) and len(state) <= TRACESTATE_MAX_CHARS:
                out["tracestate"] = state
            return out
        if not self.trace:
            self.trace = audit.trace_id(meta)
        return {"traceparent": f"00-{self.trace}-{random.getrandbits(64):016x}-01"}

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """An audit record of this call; its records share one trace id."""
        session = self.ctx.session
        if not self.trace:
            self.trace = audit.trace_id(self.meta)
        return {
            "event": event, "client": self.ctx.principal.name,
            # A prefix correlates records without writing a live session id to disk.
            "session": session.id[:SESSION_ID_SHOWN] if session else None,
            "route": self.route, "method": self.method, "request_id": self.request_id,
            "trace_id": self.trace, **({"by": self.ctx.operator} if self.ctx.operator else {}), **fields,
        }


def direct(ctx: CallContext, route: str, request_id: Any, method: str, params: Any) -> Call:
    """A direct `server.method` call (or notification): rules see its named params without the protocol's
    `_meta`."""
    return Call(ctx, route, request_id, method, params, _arguments(params), _meta_of(params))


def _meta_of(params: Any) -> Any:
    return params.get("_meta") if isinstance(params, dict) else None


def _arguments(params: Any) -> Any:
    if isinstance(params, dict) and "_meta" in params:
        return {key: value for key, value in params.items() if key != "_meta"}
    return params


def request_key(ctx: CallContext, request_id: Any) -> tuple[str, str, str]:
    """A request by its id as this client sent it in this session (calls in flight, elicitations answered)."""
    session = ctx.session.id if ctx.session else ""
    # repr tells the id 1 from the id "1", as the client meant them, without an encoder per call.
    return (ctx.principal.name, session, repr(request_id))
