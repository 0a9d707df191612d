"""Relay: the requests a tool server sends the client during a call, put to the caller who caused them.

An MCP child may ask its client for `sampling/createMessage`, `elicitation/create` or `roots/list`
while a `tools/call` of the gateway is pending on it. The dialect (upstream/dialects.py) finds the
call the request belongs to (peer.py `pending_for`: the id its `_meta` names, else the only call in
flight) and hands it, with that call's `Caller` (built here, carried by the call's `Delivery`), to
`Relay.ask`. Owns what happens then:

  - refusing at once, with an error reply to the child, what may not or cannot be asked: a kind the
    server's tools.d `relay = [...]` does not list (deny by default), one the caller's session did
    not declare at `initialize` (`sampling`, `elicitation` with the mode asked, `roots`), params the client
    could not read (`-32602`: not an object, or without what the kind needs), or one asked when
    MAX_RELAYED_PER_CALL requests of the same call, or MAX_RELAYED in all, are outstanding already;
  - otherwise sending it on the call's SSE stream under a gateway-owned id (RELAY_ID_PREFIX + a
    counter: never an approval's `gatewayd-approval-…`), the child's params as sent but for `_meta`;
  - the table of relayed requests by (client, session, gateway id), so that `answer` (reached from
    `Gateway.answer`, the one place a client's responses are routed) sends the client's result or
    error back to the child under the child's own id — once: a second answer, or one from a session
    the request was not put to, is dropped and logged;
  - every other ending answering the child with an error, never a hang: RELAY_TIMEOUT passing, the
    call finishing (answered, timed out, cancelled by the caller, failed, its server retired by a
    reload or exited), the caller disconnecting, its session ending; or the child withdrawing it (its own
    `notifications/cancelled`, or cancelling the task it sent it as: the dialect then writes it nothing).
    The client is then told `notifications/cancelled` for the id it was asked under;
  - which session each URL-mode elicitation was put to, for its completion (elicitations.py);
  - one audit record per relayed request (records.py `relayed`): server, kind, client, outcome, the
    params summarized.

A per-session child (upstream/fleet.py) may also ask outside any call (server-filesystem asks for roots at
start-up and after a roots change): `session_caller` puts those to its session's client on the session's
own stream, under the same rules, ending at the timeout or the session's end.

A 2026-07-28 child has no requests of its own: it answers with an input-required result, or a task of its own
lists them (`inputRequests`). `put` asks them of any caller as the requests they name (a legacy caller: relayed
under the same rules; the dialect retries the child with the answers, or sends them to its task), and
`RelayCaller.capabilities` is what such a child is told the caller can be asked. A legacy child's questions to a
*modern* caller are continuations.py's.

Does not own attribution to a call or writing to the child (peer.py), the capabilities a session
declared (sessions.py) or the gateway's own approval question (confirmation.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gatewayd.calls import CallContext, request_key
from gatewayd.elicitations import UrlElicitations
from gatewayd.errors import UpstreamError
from gatewayd.jsonrpc import Response
from gatewayd.records import Records
from gatewayd.values import value

if TYPE_CHECKING:
    from gatewayd.upstream.api import Caller

logger = logging.getLogger(__name__)

# A relayed request nobody answers ends this many seconds after it was sent (the call's own timeout may end it first);
# the daemon passes its `relay_timeout` setting, whose default this is.
RELAY_TIMEOUT = 300.0
# Relayed requests outstanding at once, for all calls: more are refused.
MAX_RELAYED = 1024
# Relayed requests outstanding at once for one call: a server asks its caller one thing at a time, a few at most; a
# child flooding its caller during one call is refused past this, so one call cannot take the whole MAX_RELAYED.
MAX_RELAYED_PER_CALL = 16
# Gateway-owned ids of relayed requests start so; the approval question's are `gatewayd-approval-…`.
RELAY_ID_PREFIX = "gatewayd-relay-"

# What the server's tools.d `relay` names, by the request's method.
SAMPLING, ELICITATION, ROOTS = "sampling", "elicitation", "roots"
KINDS = {"sampling/createMessage": SAMPLING, "elicitation/create": ELICITATION, "roots/list": ROOTS}

# Error codes the child is answered with: refused (not asked at all), params no client could read, timed out, ended
# otherwise.
REFUSED = -32601
BAD_PARAMS = -32602
TIMED_OUT = -32001
ENDED = -32000

Reply = Callable[[dict[str, Any]], bool]


def error_reply(message: dict[str, Any], code: int, reason: str) -> dict[str, Any]:
    """An error reply to the child's request `message`, under its own id."""
    return {"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": code, "message": reason}}


def declared(ctx: CallContext, kind: str, params: Any) -> bool:
    """Whether the caller's session declared it can answer `kind` (elicitation: in the mode asked)."""
    session = ctx.session
    if session is None:
        return False
    if kind == ELICITATION:
        mode = params.get("mode", "form") if isinstance(params, dict) else "form"
        return session.supports_elicitation(mode)
    return isinstance(session.capabilities.get(kind), dict)


def _scope(call: asyncio.Future[Any] | None, ctx: CallContext) -> object:
    """What MAX_RELAYED_PER_CALL counts a request by: its call, or its session's id when asked outside any call."""
    return call if call is not None else (ctx.session.id if ctx.session is not None else None)


def bad_params(kind: str, params: Any) -> str | None:
    """Why a relayed request's params could not be put to a client (the shape the spec requires of each kind), or
    None. What is inside (messages, schemas) is the client's to judge."""
    if params is None and kind == ROOTS:
        return None
    if not isinstance(params, dict):
        return "params must be an object"
    if kind == SAMPLING:
        if not isinstance(params.get("messages"), list):
            return "params.messages must be an array"
        if not isinstance(params.get("maxTokens"), int) or isinstance(params.get("maxTokens"), bool):
            return "params.maxTokens must be an integer"
    elif kind == ELICITATION:
        if not isinstance(params.get("message"), str):
            return "params.message must be a string"
        mode = params.get("mode", "form")
        needs = {"form": ("requestedSchema", dict), "url": ("url", str)}.get(mode) if isinstance(mode, str) else None
        if needs is None:
            return "params.mode must be \"form\" or \"url\""
        if not isinstance(params.get(needs[0]), needs[1]):
            return f"params.{needs[0]} is missing or of the wrong type"
    return None


@dataclass(eq=False)
class _Relayed:
    """One request of a child, put to a caller and not answered yet."""

    key: tuple[str, str, str]
    gateway_id: str
    message: dict[str, Any]
    kind: str
    server: str
    ctx: CallContext
    reply: Reply
    # What MAX_RELAYED_PER_CALL counts by: the call it belongs to, or the session (asked outside any call).
    scope: object
    started: float = field(default_factory=time.monotonic)
    undo: list[Callable[[], object]] = field(default_factory=list)


class Relay:
    """The relayed requests of every call, and how each ends. `caller(ctx)` is what a call's Delivery carries."""

    def __init__(self, records: Records, timeout: float = RELAY_TIMEOUT) -> None:
        self.records = records
        self.timeout = timeout
        self._relayed: dict[tuple[str, str, str], _Relayed] = {}
        # Outstanding relayed requests by the call they belong to, or the session for those outside any call
        # (MAX_RELAYED_PER_CALL).
        self._per_call: dict[object, int] = {}
        self._ids = itertools.count(1)
        # URL-mode elicitations put to sessions, for the completion their servers may send later.
        self.url_elicitations = UrlElicitations()

    def __len__(self) -> int:
        return len(self._relayed)

    def caller(self, ctx: CallContext) -> RelayCaller | None:
        """Who a call's server may ask: its caller, if it has a stream and a session to be asked on."""
        if ctx.emit is None or ctx.session is None:
            return None
        return RelayCaller(self, ctx)

    def session_caller(self, ctx: CallContext) -> RelayCaller | None:
        """Who a per-session child (upstream/fleet.py) may ask outside any call: the client of the caller's session,
        on that session's own stream (the GET stream, which holds what it cannot send yet)."""
        session = ctx.session
        if session is None:
            return None
        return RelayCaller(self, CallContext(ctx.principal, ctx.servers, session, emit=session.push,
                                             authority=ctx.authority))

    def ask(self, ctx: CallContext, server: str, allowed: Collection[str], message: dict[str, Any],
            call: asyncio.Future[Any] | None, reply: Reply,
            withdrawn: asyncio.Future[Any] | None = None) -> dict[str, Any] | None:
        """Put the child's request to the caller (None: `reply` answers it later), or the refusal to write now.
        `call` ends with the call the request belongs to (None: it belongs to the caller's session, not a call);
        `withdrawn`, when the child no longer wants the answer."""
        method = str(message.get("method"))
        kind = KINDS.get(method)
        params = message.get("params")
        refusal, code = None, REFUSED
        if kind is None:
            refusal = "not_relayable", f"{method} is not relayed to clients"
        elif kind not in allowed:
            refusal = "not_allowed", f"{method}: tool server {server!r} may not ask clients for {kind}"
        elif (why := bad_params(kind, params)) is not None:
            refusal, code = ("bad_params", f"{method}: invalid params: {why}"), BAD_PARAMS
        elif not declared(ctx, kind, params):
            refusal = "not_declared", f"{method}: the caller's client did not declare {kind}"
        elif (call is not None and call.done()) or (ctx.session is not None and ctx.session.ended):
            refusal = "call_finished", f"{method}: the call it belongs to has ended"
        elif self._per_call.get(_scope(call, ctx), 0) >= MAX_RELAYED_PER_CALL:
            refusal = "too_many", f"{method}: {MAX_RELAYED_PER_CALL} requests of this call already wait for its caller"
        elif len(self._relayed) >= MAX_RELAYED:
            refusal = "overloaded", f"{method}: too many requests wait for clients; retry later"
        if refusal is not None:
            outcome, reason = refusal
            self._record(ctx, server, kind or method, outcome, params, None, 0.0)
            return error_reply(message, code, reason)
        assert kind is not None and ctx.emit is not None and ctx.session is not None
        gateway_id = f"{RELAY_ID_PREFIX}{next(self._ids)}"
        key = request_key(ctx, gateway_id)
        scope = _scope(call, ctx)
        relayed = _Relayed(key, gateway_id, message, kind, server, ctx, reply, scope)
        self._relayed[key] = relayed
        self._per_call[scope] = self._per_call.get(scope, 0) + 1
        self._watch(relayed, call, withdrawn)
        if key not in self._relayed:
            return None  # ended while being watched (the caller had gone already): the child has its error
        outbound: dict[str, Any] = {"jsonrpc": "2.0", "id": gateway_id, "method": method}
        if isinstance(params, dict):
            outbound["params"] = {name: value for name, value in params.items() if name != "_meta"}
        ctx.emit(outbound)
        if kind == ELICITATION:
            self.url_elicitations.asked(server, params, ctx.session)
        return None

    def answer(self, ctx: CallContext, response: Response) -> bool:
        """A client's response: if it answers a relayed request (same client and session), send it to the child
        under the child's own id and return True; False for any other id."""
        relayed = self._relayed.pop(request_key(ctx, response.id), None)
        if relayed is None:
            if not (isinstance(response.id, str) and response.id.startswith(RELAY_ID_PREFIX)):
                return False
            # Not put to this session, or answered already (ended, or a second answer): the child has had its one.
            logger.info("client=%s session=%s answer to %.64s dropped: not asked of this session, or answered "
                        "already", ctx.principal.name, ctx.session.id if ctx.session else None, response.id)
            return True
        child_id = relayed.message.get("id")
        if response.error is not None:
            outcome = "client_error"
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": child_id, "error": response.error}
        else:
            outcome = "answered"
            reply = {"jsonrpc": "2.0", "id": child_id, "result": response.result}
        self._finish(relayed, outcome, reply, tell_client=False)
        return True

    def end(self, key: tuple[str, str, str], outcome: str, reason: str, code: int = ENDED) -> None:
        """End a relayed request without the client's answer: the child gets an error, the client a cancel."""
        relayed = self._relayed.pop(key, None)
        if relayed is not None:
            method = relayed.message.get("method")
            self._finish(relayed, outcome, error_reply(relayed.message, code, f"{method}: {reason}"), tell_client=True)

    def _watch(self, relayed: _Relayed, call: asyncio.Future[Any] | None,
               withdrawn: asyncio.Future[Any] | None) -> None:
        """Every way the request can end without an answer ends it."""
        key, ctx = relayed.key, relayed.ctx
        loop = asyncio.get_running_loop()
        timer = loop.call_later(
            self.timeout, self.end, key, "timeout", f"the client did not answer within {self.timeout:g}s", TIMED_OUT)
        relayed.undo.append(timer.cancel)

        if call is not None:
            def call_done(_future: asyncio.Future[Any]) -> None:
                self.end(key, "call_finished", "the call it belongs to has ended")

            call.add_done_callback(call_done)
            relayed.undo.append(lambda: call.remove_done_callback(call_done))
        if withdrawn is not None:
            def withdrawn_done(_future: asyncio.Future[Any]) -> None:
                self.end(key, "withdrawn", "the tool server withdrew it")

            withdrawn.add_done_callback(withdrawn_done)
            relayed.undo.append(lambda: withdrawn.remove_done_callback(withdrawn_done))
        # Taken back in a later turn: a session's end or a disconnect may be running these very callbacks (Once).
        if ctx.on_disconnect is not None:
            gone = ctx.on_disconnect(lambda: self.end(key, "disconnected", "the caller disconnected"))
            relayed.undo.append(lambda: loop.call_soon(gone))
        if ctx.session is not None:
            ended = ctx.session.on_end(lambda: self.end(key, "session_ended", "the caller's session ended"))
            relayed.undo.append(lambda: loop.call_soon(ended))

    def _finish(self, relayed: _Relayed, outcome: str, reply: dict[str, Any], *, tell_client: bool) -> None:
        for step in relayed.undo:
            step()
        relayed.undo.clear()
        left = self._per_call.pop(relayed.scope, 1) - 1
        if left:
            self._per_call[relayed.scope] = left
        sent = relayed.reply(reply)
        emit = relayed.ctx.emit
        if tell_client and emit is not None and outcome != "session_ended":
            # Settled without the client's answer: let it close its question (a client that lost its connection
            # hears it if it takes its stream up again: resumable.py).
            emit({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": relayed.gateway_id, "reason": outcome}})
        logger.info("client=%s server=%s %s %s: %s%s", relayed.ctx.principal.name, relayed.server,
                    relayed.message.get("method"), relayed.gateway_id, outcome, "" if sent else " (child not told)")
        self._record(relayed.ctx, relayed.server, relayed.kind, outcome, relayed.message.get("params"),
                     relayed.gateway_id, time.monotonic() - relayed.started)

    def _record(self, ctx: CallContext, server: str, kind: str, outcome: str, params: Any, gateway_id: str | None,
                seconds: float) -> None:
        session = ctx.session
        self.records.relayed(server=server, kind=kind, client=ctx.principal.name,
                             session=session.id if session else None, request_id=gateway_id, outcome=outcome,
                             params=params, seconds=seconds)


@value
class RelayCaller:
    """A call's caller, as its Delivery carries it (api.Caller): the relay and the call's context."""

    relay: Relay
    ctx: CallContext

    def ask(self, server: str, allowed: Collection[str], message: dict[str, Any], call: asyncio.Future[Any] | None,
            reply: Reply, withdrawn: asyncio.Future[Any] | None = None) -> dict[str, Any] | None:
        return self.relay.ask(self.ctx, server, allowed, message, call, reply, withdrawn)

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the caller's session declared it can be asked: a modern (2026-07-28) child is told so."""
        declared = self.ctx.session.capabilities if self.ctx.session is not None else {}
        return {kind: value for kind in (SAMPLING, ELICITATION, ROOTS)
                if isinstance(value := declared.get(kind), dict)}

    @property
    def log_level(self) -> str | None:
        """The level the caller's session set (`logging/setLevel`; every level until it does)."""
        return self.ctx.session.log_level if self.ctx.session is not None else None

    def tell(self, status: str) -> None:
        """Nothing to show: a legacy caller hears a child task's status as progress, if it asked for progress."""

    @property
    def answers_input(self) -> bool:
        """A legacy caller knows no input-required result: its questions are put to it (`put` below)."""
        return False


async def put(caller: Caller, server: str, allowed: Collection[str], requests: dict[str, Any]) -> dict[str, Any]:
    """Input requests of a child (an input-required result's, or a task's `inputRequests`) put to the call's caller,
    each as the request it names would be (`Caller.ask`: relayed on a legacy caller's stream, a question of a modern
    caller's continuation); their results by key, the child's `inputResponses`. One refused, failed or not answered in
    time fails the call with that error (the child's era has no error answer to give it). Each ends within the relay's
    timeout, or with the caller."""
    loop = asyncio.get_running_loop()
    # The questions' own call: ended on the way out, so that a question still asked then is settled (cancelled); a
    # caller that must refuse one outright (a modern caller that declared no such capability) fails it.
    alive: asyncio.Future[None] = loop.create_future()
    waits: dict[str, asyncio.Future[dict[str, Any]]] = {}
    try:
        for key, request in list(requests.items())[:MAX_RELAYED_PER_CALL]:
            got: asyncio.Future[dict[str, Any]] = loop.create_future()
            request = request if isinstance(request, dict) else {}
            message = {"jsonrpc": "2.0", "id": f"input-{key}", "method": request.get("method"),
                       "params": request.get("params")}
            now = caller.ask(server, allowed, message, alive, _resolver(got))
            if alive.done():
                alive.result()  # the caller failed the call: its error, not the refusal written for the child
            if now is not None:
                _resolver(got)(now)
            waits[str(key)] = got
        answers: dict[str, Any] = {}
        for key, got in waits.items():
            answer = await got
            if "result" not in answer:
                raise UpstreamError(answer.get("error") or {"code": ENDED, "message": "not answered"})
            answers[key] = answer["result"]
        return answers
    finally:
        if not alive.done():
            alive.set_result(None)


def _resolver(got: asyncio.Future[dict[str, Any]]) -> Reply:
    """A `reply` that settles `got` with the first answer."""
    def reply(message: dict[str, Any]) -> bool:
        if not got.done():
            got.set_result(message)
        return True
    return reply
