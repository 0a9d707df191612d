"""Continuations: a modern (MCP 2026-07-28) call kept running between its input-required answer and its retry.

A legacy tool server asks its client during a call (`elicitation/create`, `sampling/createMessage`, `roots/list`) and
waits for the answer inside that call; a modern caller has no stream to be asked on, only its next HTTP request. So a
modern call whose caller declared something it could be asked runs as a task owned by this registry. When its server
asks, the HTTP request is answered with an input-required result carrying the question (web/modern.py seals a
`requestState` naming the continuation), the call stays pending at the child, and the caller's retry sends its
answers to the child under the child's own ids and waits again: for the call's answer, or the next question.
A call that may become a task of its caller (modern_tasks.py) runs as one too: once it is a task, its questions wait
for `tasks/update` (`answer_some`, any of them at a time) rather than a retry, and its changes are told to the task.

Owns: those tasks (`close` ends them when the daemon stops), the questions of each (put to the caller with the relay's
rules: the server's tools.d `relay`, the caller's declared capabilities, params a client can read, at most
relay.MAX_RELAYED_PER_CALL outstanding; each audited as a `relayed` record), and parking between requests: at most
MAX_PARKED_PER_CLIENT parked per client, each for at most the park timeout (the daemon's `relay_timeout`). A parked
continuation nobody comes back for, or one whose caller goes away while it waits, is abandoned: the call is cancelled
at the child (peer.py sends `notifications/cancelled`) and every open question of the child answered with an error,
never left waiting. The call's own timeout keeps running while it is parked. Does not own sealing the state
(request_state.py), HTTP (web/modern.py) or the legacy relay on a session's stream (relay.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from gatewayd import relay
from gatewayd.calls import Call
from gatewayd.errors import GatewayError, InvalidParams, Overloaded, RequestCancelled
from gatewayd.records import Records

logger = logging.getLogger(__name__)

# Parked continuations one client may have at once: each holds a call open at a child, and a slot of its server's
# `max_in_flight` (16 by default); a client that keeps starting calls and never answers must not hold a whole server.
# A person answers one question at a time, a few at most.
MAX_PARKED_PER_CLIENT: Final = 8
# Seconds `close` waits for the abandoned calls to end (each sends the child a cancel): a stuck child must not hold
# the daemon's stop.
CLOSE_WAIT: Final = 5.0
# The length of a continuation's id (bytes of randomness): it is only ever inside a sealed state, unguessable anyway.
ID_BYTES: Final = 16
# Events (progress, log messages) a parked call's child sends while no request of its caller is open: kept for the
# retry's stream, the oldest dropped past this many (a child reporting while its caller thinks must not grow memory
# without bound; the newest progress says the most).
MAX_HELD_EVENTS: Final = 256
# The progress token a call that may become a task is sent with when its caller gave none: its tool server's progress
# then says how the task goes (`statusMessage`), and reaches no stream.
STATUS_TOKEN: Final = "io.gatewayd/status"
PROGRESS: Final = "notifications/progress"

# Whether the caller declared it can answer a question of a kind (relay.KINDS), given the question's params.
Declares = Callable[[str, Any], bool]


@dataclass(eq=False)
class Question:
    """One request of a child, to be put to (or put to) the modern caller as an input request."""

    key: str
    message: dict[str, Any]
    kind: str
    server: str
    reply: relay.Reply
    started: float = field(default_factory=time.monotonic)
    done: bool = False

    def input_request(self) -> dict[str, Any]:
        """The child's request as an input request for the caller: its method and params, without its `_meta`
        (the child's own)."""
        request: dict[str, Any] = {"method": self.message.get("method")}
        params = self.message.get("params")
        if isinstance(params, dict):
            request["params"] = {name: value for name, value in params.items() if name != "_meta"}
        return request


class Continuation:
    """One modern call running as a task, and the questions its server has asked the caller."""

    def __init__(self, registry: Continuations, client: str, call: Awaitable[dict[str, Any]]) -> None:
        self.registry = registry
        self.client = client
        self.id = secrets.token_urlsafe(ID_BYTES)
        # Where the call's notifications go now: the stream of the HTTP request waiting on it (None: held).
        self.sink: Any = None
        self._held: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_HELD_EVENTS)
        self._dropped = 0
        # The call as decided, and its check that the client may still make it (Gateway._call tells `decided`).
        self.call: Call | None = None
        self._still_allowed: Callable[[], None] | None = None
        self.rounds = 0
        self._keys = itertools.count(1)
        self._fresh: list[Question] = []
        self._asked: list[Question] = []
        self._open: dict[str, Question] = {}
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Told whenever the call's state changes: a question asked or settled, the call ended (a task's
        # `lastUpdatedAt`, modern_tasks.py).
        self.on_change: Callable[[], None] | None = None
        # Why the call was abandoned, once it was: (outcome, reason).
        self.abandoned: tuple[str, str] | None = None
        # How the call's work goes, as its tool server said last (a modern child's task's `statusMessage`, a progress
        # notification's message).
        self.status: str | None = None
        self.task: asyncio.Task[dict[str, Any]] = asyncio.ensure_future(call)
        self.task.add_done_callback(self._ended)

    def emit(self, message: dict[str, Any]) -> None:
        """The call's event sink: the current request's stream; held for the next one while parked. A progress
        message is also how the call's work goes (`status`); one under STATUS_TOKEN is that only (the gateway asked
        for it, the caller did not: web/modern.py)."""
        if message.get("method") == PROGRESS:
            params = message.get("params")
            if isinstance(params, dict):
                if isinstance(said := params.get("message"), str):
                    self.tell(said)
                if params.get("progressToken") == STATUS_TOKEN:
                    return
        if self.sink is not None:
            self.sink(message)
            return
        if len(self._held) == MAX_HELD_EVENTS:
            self._dropped += 1
        self._held.append(message)

    def attach(self, sink: Any) -> None:
        """Send the call's events to a request's stream from now on, those held while parked first, in order."""
        self.sink = sink
        while self._held:
            sink(self._held.popleft())
        if self._dropped:
            logger.info("client=%s parked call: %d events over %d dropped while parked", self.client, self._dropped,
                        MAX_HELD_EVENTS)
            self._dropped = 0

    def detach(self) -> None:
        self.sink = None

    def decided(self, call: Call, still_allowed: Callable[[], None] | None) -> None:
        """The call was decided (Gateway._call): keep what a retry decides it again with, and wake the request
        waiting to learn whether it may become a task (`wait` answers None)."""
        self.call, self._still_allowed = call, still_allowed
        self._wake()

    def tell(self, status: str) -> None:
        """The tool server says how the call's work goes (a task of its own): kept, and told as a change."""
        if status != self.status:
            self.status = status
            self._changed()

    def check(self) -> None:
        """Decide the call again as of now: the route's "unknown" error when the client may no longer make it."""
        if self._still_allowed is not None:
            self._still_allowed()

    def resume(self, answers: dict[str, Any]) -> None:
        """A retry brings the caller's answers: decide the call again as of now (a reload may have taken the
        client's permission away, or the client itself), record the round, and send the answers to the child.
        Denied, the call is abandoned and the route's "unknown" error raised, as for a new call."""
        self.rounds += 1
        records = self.registry.records
        try:
            if self._still_allowed is not None:
                self._still_allowed()
        except GatewayError:
            if records is not None and self.call is not None:
                records.resumed(self.call, self.rounds, "denied", len(answers))
            self.abandon("denied", "the client may no longer make this call")
            raise
        if records is not None and self.call is not None:
            records.resumed(self.call, self.rounds, "resumed", len(answers))
        self.answer(answers)

    # -- the child's side ------------------------------------------------------------------------

    def ask(self, server: str, allowed: Collection[str], message: dict[str, Any], declares: Declares,
            call: asyncio.Future[Any] | None, reply: relay.Reply,
            withdrawn: asyncio.Future[Any] | None = None) -> dict[str, Any] | None:
        """Take the child's request as a question for the caller (None: answered later), or the refusal to write now.
        `declares(kind, params)` says whether the caller declared it can answer; `withdrawn` ends when the child no
        longer wants the answer (the question is then settled, and an answer to it dropped)."""
        method = str(message.get("method"))
        kind = relay.KINDS.get(method)
        params = message.get("params")
        refusal, code = None, relay.REFUSED
        if kind is None:
            refusal = "not_relayable", f"{method} is not relayed to clients"
        elif kind not in allowed:
            refusal = "not_allowed", f"{method}: tool server {server!r} may not ask clients for {kind}"
        elif (why := relay.bad_params(kind, params)) is not None:
            refusal, code = ("bad_params", f"{method}: invalid params: {why}"), relay.BAD_PARAMS
        elif not declares(kind, params):
            refusal = "not_declared", f"{method}: the caller's client did not declare {kind}"
        elif self.task.done() or (call is not None and call.done()):
            refusal = "call_finished", f"{method}: the call it belongs to has ended"
        elif len(self._open) >= relay.MAX_RELAYED_PER_CALL:
            refusal = "too_many", f"{method}: {relay.MAX_RELAYED_PER_CALL} requests of this call already wait"
        if refusal is not None:
            outcome, reason = refusal
            self.registry.record(self.client, server, kind or method, outcome, params, None, 0.0)
            return relay.error_reply(message, code, reason)
        assert kind is not None
        question = Question(f"{relay.RELAY_ID_PREFIX}{next(self._keys)}", message, kind, server, reply)
        self._open[question.key] = question
        self._fresh.append(question)
        if call is not None:
            call.add_done_callback(lambda _f: self._end(question, "call_finished", "the call it belongs to has ended"))
        if withdrawn is not None:
            withdrawn.add_done_callback(lambda _f: self._end(question, "withdrawn", "the tool server withdrew it"))
        self._wake()
        return None

    # -- the caller's side -----------------------------------------------------------------------

    async def wait(self, timeout: float | None = None) -> dict[str, Any] | list[Question] | None:
        """The call's answer once it has one, or the questions its server asked since the last round; None when
        `timeout` seconds pass first, or the call was decided meanwhile (the call goes on). The waiting request being
        cancelled (its caller went away) abandons the call."""
        if not self.task.done() and not self._fresh:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                if timeout is None:
                    await self._waiter
                else:
                    await asyncio.wait((self._waiter,), timeout=timeout)
            except asyncio.CancelledError:
                self.abandon("disconnected", "the caller went away")
                raise
            finally:
                self._waiter = None
            if not self.task.done() and not self._fresh:
                return None
        if self.task.cancelled():
            # Abandoned while this request waited on it (the daemon stopping): an answer, not this request's cancel.
            raise RequestCancelled("the call was abandoned: the gateway is stopping")
        if self.task.done():
            return self.task.result()
        self._asked, self._fresh = self._fresh, []
        return list(self._asked)

    def answer(self, answers: dict[str, Any]) -> None:
        """Send the caller's answers to the questions of the last round to the child, under the child's ids; one the
        caller left unanswered gets an error (the child must not wait for what will not come)."""
        asked, self._asked = self._asked, []
        for question in asked:
            if question.done:
                continue
            result = answers.get(question.key)
            if isinstance(result, dict):
                self._settle(question, "answered", {"jsonrpc": "2.0", "id": question.message.get("id"),
                                                    "result": result})
            else:
                self._end(question, "not_answered", "the caller did not answer", relay.BAD_PARAMS)

    def outstanding(self) -> list[Question]:
        """The questions the child asked that wait for an answer, oldest first."""
        return list(self._open.values())

    def answer_some(self, answers: dict[str, Any]) -> None:
        """Send the child the caller's answers to any of its open questions (a task's `tasks/update`): each key that
        names one is settled (an answer that is no object ends it with an error, as an unanswered one); other keys
        (never asked, answered already) are passed over, and the questions not answered stay open."""
        for key, result in answers.items():
            question = self._open.get(key) if isinstance(key, str) else None
            if question is None:
                continue
            if isinstance(result, dict):
                self._settle(question, "answered", {"jsonrpc": "2.0", "id": question.message.get("id"),
                                                    "result": result})
            else:
                self._end(question, "not_answered", "the answer was not an object", relay.BAD_PARAMS)

    def abandon(self, outcome: str, reason: str) -> None:
        """End the call at the child and answer its open questions with an error."""
        if self.abandoned is None and not self.task.done():
            self.abandoned = outcome, reason
        for question in list(self._open.values()):
            code = relay.TIMED_OUT if outcome == "timeout" else relay.ENDED
            self._end(question, outcome, reason, code)
        self.task.cancel()

    def _end(self, question: Question, outcome: str, reason: str, code: int = relay.ENDED) -> None:
        method = question.message.get("method")
        self._settle(question, outcome, relay.error_reply(question.message, code, f"{method}: {reason}"))

    def _settle(self, question: Question, outcome: str, reply: dict[str, Any]) -> None:
        if question.done:
            return
        question.done = True
        self._open.pop(question.key, None)
        if question in self._fresh:
            # Settled before any round took it (a task's answers come so): a call asking without end holds no more.
            self._fresh.remove(question)
        sent = question.reply(reply)
        logger.info("client=%s server=%s %s %s (modern caller): %s%s", self.client, question.server,
                    question.message.get("method"), question.key, outcome, "" if sent else " (child not told)")
        self.registry.record(self.client, question.server, question.kind, outcome,
                             question.message.get("params"), question.key, time.monotonic() - question.started)
        self._changed()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _ended(self, task: asyncio.Task[dict[str, Any]]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: the waiting request reads it, or nobody will
        for question in list(self._open.values()):
            self._end(question, "call_finished", "the call it belongs to has ended")
        self.registry.running.discard(self)
        self._wake()


class Continuations:
    """Every continuation running, and those parked until their caller's retry."""

    def __init__(self, records: Records | None = None, timeout: float = relay.RELAY_TIMEOUT,
                 max_per_client: int = MAX_PARKED_PER_CLIENT) -> None:
        self.records = records
        self.timeout = timeout
        self.max_per_client = max_per_client
        self.running: set[Continuation] = set()
        self._parked: dict[str, tuple[Continuation, asyncio.TimerHandle]] = {}
        self._per_client: dict[str, int] = {}

    def start(self, client: str, call: Awaitable[dict[str, Any]]) -> Continuation:
        """Run `call` as a continuation owned here."""
        continuation = Continuation(self, client, call)
        self.running.add(continuation)
        return continuation

    def park(self, continuation: Continuation) -> None:
        """Keep the continuation until its caller's retry, or the park timeout (then it is abandoned); Overloaded,
        and abandoned at once, past the client's MAX_PARKED_PER_CLIENT."""
        client = continuation.client
        if self._per_client.get(client, 0) >= self.max_per_client:
            continuation.abandon("too_many", "the caller has too many calls waiting for its answers")
            raise Overloaded(f"{self.max_per_client} calls already wait for this client's answers: answer or "
                             "abandon those first", {"limit": self.max_per_client})
        timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, continuation.id)
        self._parked[continuation.id] = continuation, timer
        self._per_client[client] = self._per_client.get(client, 0) + 1

    def take(self, continuation_id: Any, client: str) -> Continuation:
        """The parked continuation a retry's state names, no longer parked; -32602 when there is none (answered
        already, timed out, abandoned) or it is another client's."""
        parked = self._parked.get(continuation_id) if isinstance(continuation_id, str) else None
        if parked is None or parked[0].client != client:
            raise InvalidParams("requestState names a call that no longer waits for answers (answered already, "
                                "timed out or abandoned): send the request without it", {"reason": "used"})
        self._unpark(continuation_id)
        return parked[0]

    def parked(self, client: str) -> int:
        return self._per_client.get(client, 0)

    def _unpark(self, continuation_id: str) -> Continuation | None:
        parked = self._parked.pop(continuation_id, None)
        if parked is None:
            return None
        continuation, timer = parked
        timer.cancel()
        left = self._per_client.pop(continuation.client, 1) - 1
        if left:
            self._per_client[continuation.client] = left
        return continuation

    def _expire(self, continuation_id: str) -> None:
        continuation = self._unpark(continuation_id)
        if continuation is not None:
            logger.info("client=%s continuation not retried within %gs: abandoned", continuation.client, self.timeout)
            continuation.abandon("timeout", f"the caller did not answer within {self.timeout:g}s")

    def record(self, client: str, server: str, kind: str, outcome: str, params: Any, key: str | None,
               seconds: float) -> None:
        if self.records is not None:
            self.records.relayed(server=server, kind=kind, client=client, session=None, request_id=key,
                                 outcome=outcome, params=params, seconds=seconds)

    def abandon_parked(self) -> None:
        """Abandon the parked continuations (the daemon stops): nobody waits on them, so draining the calls in
        flight must not wait for them."""
        for continuation_id in list(self._parked):
            continuation = self._unpark(continuation_id)
            if continuation is not None:
                continuation.abandon("shutdown", "the gateway is stopping")

    async def close(self) -> None:
        """Abandon every continuation left (the daemon stops): each child is told, none waits."""
        self.abandon_parked()
        running = list(self.running)
        for continuation in running:
            continuation.abandon("shutdown", "the gateway is stopping")
        if running:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT):
                    await asyncio.gather(*(c.task for c in running), return_exceptions=True)
