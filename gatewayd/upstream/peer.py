"""The gateway's JSON-RPC peer on one child's stdio pipes: ids, pending calls, answers, the child's own messages.

Owns: the gateway's request ids toward the child, the table of calls waiting for an answer and
their deadlines, matching responses to them, the requests that stay open and are no call (a 2026-07-28
child's `subscriptions/listen`: `listen`), the child's requests (answered by `on_request`, or
by `default_reply`) and notifications (routed to the call they belong to, or to the owner), and
failing the calls pending when the child is gone (with how it ended, never its stderr: the child
is every client's, its stderr is in the daemon's log). A request of the child whose id is not a string
or an integer is answered `-32600` (id null); one reusing the id of a request of its own still waiting
for a reply left for later is answered `-32600` at once, and the first one is unharmed: only it gets the
later reply.
Also the bounds a misbehaving child meets on this side: its requests are answered at most
CHILD_REQUEST_RATE a second (the rest dropped unanswered), and once STDIN_BACKLOG_LIMIT bytes wait
in front of its stdin, answers to its requests are dropped and new calls refused at once, until it
reads again; each episode is logged once and every drop counted (`Peer.dropped`).
Does not own: the process, its pipes or its stop (process.py), MCP handshakes or restarts
(server.py). A response with an unknown id, or a stdout line that is not JSON, is logged and dropped;
so is a line with a number JSON cannot carry (NaN, Infinity, 1e400), except that the call it answers
fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gatewayd import jsonrpc, jsontext
from gatewayd.deadlines import Deadlines
from gatewayd.errors import CallTimedOut, GatewayError, ToolServerUnavailable, UpstreamError
from gatewayd.upstream.process import MAX_LINE_BYTES, ChildProcess, ExitInfo, Line, unavailable

logger = logging.getLogger(__name__)

# Bytes that may wait in front of a child's stdin before the peer stops adding to them: four of the
# largest request bodies (settings.max_body_bytes, 4 MiB), so a healthy child reading a big call slowly is
# not refused, while one that stopped reading holds at most this much of the daemon's memory (plus the
# calls already admitted, each bounded by the body limit).
STDIN_BACKLOG_LIMIT = 16 * 1024 * 1024
# Requests a child sends unasked are answered at most this many a second, after a burst of as many: far
# above what a tool server asks (a ping, roots/list once in a while), and a flood of them costs the
# daemon's CPU and the child's stdin, so the rest are dropped unanswered.
CHILD_REQUEST_RATE = 100.0
CHILD_REQUEST_BURST = 100
# A notification waits this long at most for the child's stdin to take it: a child that stopped
# reading must not hold the client's request (or a shielded `notifications/cancelled`) for ever.
NOTIFY_DRAIN_TIMEOUT = 10.0
# Loop turns in a row that each sent the child one line before its lines go out at once again instead of at the
# end of the turn (peer._write): a few, so that calls which only now and then arrive alone keep being batched.
SINGLE_TURNS = 8

EventSink = Callable[[dict[str, Any]], None]
# The `_meta` key by which a child's request may name the gateway's request it belongs to.
RELATED_REQUEST = "io.modelcontextprotocol/related-request-id"
# Answers a request the child sent: the reply message to write back, or None to send it later (`Peer.reply`).
RequestHandler = Callable[[dict[str, Any]], dict[str, Any] | None]

# The head of a response whose `id` member comes first (after `jsonrpc`, or before it, or without it), followed by its
# `result` or `error`: the top-level object for certain, so the id is the call's (`Peer.overlong`).
_ANSWER_HEAD = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(\d+)\s*,\s*'
                          rb'(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"\s*:')
# A response written the other way round: its `result` or `error` first (after `jsonrpc`, if that comes first) and
# its `id` last. Only the top-level object's last member is followed by nothing but its closing brace, and a `"`
# after `,` or `{` opens a key (one inside a string would be escaped), so that id is the call's too.
_RESPONSE_HEAD = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"\s*:')
_ID_TAIL = re.compile(rb'[{,]\s*"id"\s*:\s*(\d+)\s*\}\s*\Z')


def answered_id(head: bytes, tail: bytes | None, only: int | None = None) -> int | None:
    """The id of the call an overlong line answers, from its first bytes and (once it has ended) its last bytes, when
    they tell it for certain; else None. `only`: the one request of the gateway's the child has not answered, if
    there is one alone; a response (its head says so) whose id is elsewhere answers that one."""
    match = _ANSWER_HEAD.match(head)
    if match:
        return int(match.group(1))
    if tail is None or not _RESPONSE_HEAD.match(head):
        return None
    match = _ID_TAIL.search(tail)
    return int(match.group(1)) if match else only


@dataclass
class PendingCall:
    """A request sent to the child and waiting for its answer."""

    method: str
    future: asyncio.Future[Any]
    on_event: EventSink | None
    started: float = field(default_factory=time.monotonic)
    # Who the child's own requests during this call are put to (relay.py); None: nobody.
    caller: Any = None
    # A call whose deadline follows its activity (an agent's turn): how long it may stay silent, and the deadline
    # `Peer.touch` re-arms.
    silence: float | None = None
    quiet: Any = None
    # Waits of the call's own that are not its silence (an agent waiting for a person's answer): while any is on,
    # the silence deadline is off.
    held: int = 0


@dataclass
class Dropped:
    """What a peer did not do because its child misbehaved, counted since it started."""

    # Requests of the child dropped unanswered: it asked faster than CHILD_REQUEST_RATE.
    requests: int = 0
    # Answers to the child's requests dropped: more than the backlog limit waited in front of its stdin.
    replies: int = 0
    # Calls and notifications refused at once, for the same reason.
    calls: int = 0


class NonFinite(ValueError):
    """A child's line holds a number JSON cannot carry: NaN, Infinity, or a literal too large for a double."""


def _refuse_constant(name: str) -> Any:
    raise NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf is nan: `1e400` overflowed
        raise NonFinite(text)
    return value


# Made once: json.loads with hooks would build a decoder for every line. The float hook costs about 50 ns per
# float literal, and nothing for a line without one.
_decode = jsontext.decoding(json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float))


def decode_line(line: Line) -> str:
    """A line of the child's stdout as text: UTF-8, as json.loads takes bytes, and a surrogate's three bytes pass
    through as that surrogate."""
    return line.decode("utf-8", "surrogatepass")


def parse_text(text: str) -> Any:
    """A decoded line of the child's stdout as JSON. Raises NonFinite for a number JSON cannot carry (the gateway
    could not send it on), or ValueError for anything else that is not JSON."""
    return _decode(text)


class _Bucket:
    """A token bucket: `take()` is True at most `rate` times a second after a burst of `burst`."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    @property
    def full(self) -> bool:
        """Whether the bucket refilled (as of the last `take`) to its burst: the child has been calm a while."""
        return self.tokens >= self.burst - 1.0


def _invalid(request_id: str | int | None, reason: str) -> dict[str, Any]:
    """The `-32600` reply to a request of the child that cannot be taken as it is."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": f"Invalid Request: {reason}"}}


def default_reply(message: dict[str, Any]) -> dict[str, Any]:
    """The gateway's answer to a request from the child that nothing else answers. A child may ping us; other
    requests (roots/list, sampling, …) are not relayed yet: they are refused (-32601) so the child does not wait."""
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    if message.get("method") == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": "Method not found"}
    return reply


class Peer:
    """JSON-RPC over a `ChildProcess`: `call`/`notify` toward the child; `lines` takes what the child writes.

    `on_notification` receives notifications that belong to no call; `on_activity` is called whenever
    stdout lines arrive; `on_request` answers the child's own requests (default: `default_reply`).
    `stdin_backlog_limit`, `request_rate` and `request_burst` are the bounds of the module docstring.
    """

    def __init__(
        self,
        process: ChildProcess,
        *,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
        on_activity: Callable[[], None] | None = None,
        on_request: RequestHandler | None = None,
        deadlines: Deadlines | None = None,
        stdin_backlog_limit: int = STDIN_BACKLOG_LIMIT,
        request_rate: float = CHILD_REQUEST_RATE,
        request_burst: int = CHILD_REQUEST_BURST,
        private: bool = False,
    ) -> None:
        self.name = process.name
        self.tag = process.tag
        self._process = process
        self._on_notification = on_notification
        self._on_activity = on_activity
        self._on_request = on_request or default_reply
        self._pending: dict[int, PendingCall] = {}
        # Open requests that are no call: a 2026-07-28 child's `subscriptions/listen` streams (`listen`), each told
        # its end, if the child ends it.
        self._listens: dict[int, Callable[[dict[str, Any]], None]] = {}
        # The child is one client's alone (fleet.py): its last stderr lines may go to that client when it dies.
        self._private = private
        # Ids of the child's own requests whose replies were left for later (`reply`): a request reusing one is refused.
        # As many as requests wait (each one relayed, relay.MAX_RELAYED in all), until each gets its reply.
        self._awaiting: set[str | int] = set()
        self._next_id = 0
        self._outbox: list[bytes] | None = None  # this loop turn's lines not sent yet (None: the turn sent none)
        self._single_turns = SINGLE_TURNS  # loop turns in a row that sent one line each (_write)
        # The calls' deadlines: one loop timer for many calls, not one per call.
        self._deadlines = deadlines or Deadlines()
        self._backlog_limit = stdin_backlog_limit
        self._requests = _Bucket(request_rate, request_burst)
        self.dropped = Dropped()
        # Inside an episode (logged when it starts and when it ends, not per message): the child's stdin is
        # over the backlog limit; the child asks faster than the rate.
        self._stuck = False
        self._flooding = False

    @property
    def in_flight(self) -> int:
        """Calls waiting for an answer."""
        return len(self._pending)

    # -- sending ---------------------------------------------------------------------------

    def _write(self, message: dict[str, Any], large: bool = False) -> None:
        """Send one line to the child. While calls come one at a time, a line that finds nothing else waiting for
        the child goes out at once, and nothing is left for the end of the loop turn: a lone call waits for no
        extra turn (×1.04-1.07 calls/s at 1 in flight), and its turn schedules no flush (~140 bytecodes a call
        fewer). Other lines go out together at the end of their turn, one write and one wake-up of the child for
        all of them (the pipe write was the largest single cost of a call under load; writing each turn's first
        line apart from the rest cost ×0.97 at 32 in flight); once a turn sends more than one, every line waits
        for its turn's end, until SINGLE_TURNS turns in a row have had one line each. A `large` message (one holding
        a string over jsontext.LARGE_STRING) is made from its strings' bytes: the same line at a third of the cost."""
        if not self._process.alive:
            raise unavailable(self.name, "is not running")
        line = (b"".join(jsontext.parts(message, jsonrpc.dumps)) if large else jsonrpc.dumps(message)) + b"\n"
        if self._outbox is None:
            if not self._pending and self._single_turns >= SINGLE_TURNS:
                self._process.write(line)
                return
            self._outbox = []
            asyncio.get_running_loop().call_soon(self.flush)
        self._outbox.append(line)

    def flush(self) -> None:
        """Write the lines queued so far, now."""
        lines, self._outbox = self._outbox, None
        if lines is None:
            return  # flushed already this turn (a connection closing flushes at once)
        if len(lines) > 1:
            self._single_turns = 0
        elif self._single_turns < SINGLE_TURNS:
            self._single_turns += 1
        self._process.write(b"".join(lines))

    async def notify(self, method: str, params: Any = None, *, large: bool = False) -> None:
        """Send a notification; nothing comes back (`large` as `call` takes it). Raises ToolServerUnavailable when
        the child is not running or not reading its stdin (over the backlog limit)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._send(message, method, large)
        with contextlib.suppress(TimeoutError):
            # Past the wait it stays queued; the limit bounds what piles up behind it.
            async with asyncio.timeout(NOTIFY_DRAIN_TIMEOUT):
                await self._process.drain()

    def listen(self, method: str, params: Any, on_end: Callable[[dict[str, Any]], None]) -> int:
        """Open a request that stays open (a 2026-07-28 child's `subscriptions/listen`): no call and no deadline,
        its notifications the owner's as any the child sends outside a call; its id. `on_end` hears the response
        that ends it, if the child ends it (its own end, or a refusal); `unlisten` ends it from this side. Raises
        ToolServerUnavailable as `notify` does."""
        listen_id = self.new_id()
        self._send({"jsonrpc": "2.0", "id": listen_id, "method": method, "params": params}, method, False)
        self._listens[listen_id] = on_end
        return listen_id

    def unlisten(self, listen_id: int) -> None:
        """End a `listen` request: the child is told `notifications/cancelled`, as the spec ends one on stdio."""
        if self._listens.pop(listen_id, None) is not None and self._process.alive:
            with contextlib.suppress(ToolServerUnavailable):
                self._write({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": listen_id, "reason": "no longer needed"}}, False)

    def _send(self, message: dict[str, Any], method: str, large: bool) -> None:
        """Write a message that waits for no answer, unless the child is over its stdin backlog limit (refused:
        ToolServerUnavailable). `call` makes the same check inline, being on every call's path."""
        backlog = self._process.backlog()
        if backlog > self._backlog_limit or self._stuck:
            self._check_backlog(backlog, method)
        self._write(message, large)

    def new_id(self) -> int:
        """Reserve the gateway's next request id toward this child (also usable as a progress token)."""
        self._next_id += 1
        return self._next_id

    async def call(
        self,
        method: str,
        params: Any,
        *,
        timeout: float,
        on_event: EventSink | None = None,
        request_id: int | None = None,
        cancel_on_timeout: bool = False,
        caller: Any = None,
        silence: float | None = None,
        large: bool = False,
    ) -> Any:
        """Send a request and wait for its result.

        Raises UpstreamError (the child's own error), CallTimedOut, or ToolServerUnavailable.
        On timeout or cancellation the call is forgotten and, if `cancel_on_timeout`, the child
        gets `notifications/cancelled`. `caller` is kept with the call for `pending_for`. With `silence`, the call
        also ends once that many seconds pass without `touch` (its activity), `timeout` staying its hard cap.
        `large`: `params` hold a string over jsontext.LARGE_STRING (the line is made from its bytes).
        """
        call_id = request_id if request_id is not None else self.new_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": call_id, "method": method}
        if params is not None:
            message["params"] = params
        # The one check on the hot path: lines are written at the end of this loop turn, so this is what waits
        # in front of the child from earlier calls.
        backlog = self._process.backlog()
        if backlog > self._backlog_limit or self._stuck:
            self._check_backlog(backlog, method)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write(message, large)
        pending = self._pending[call_id] = PendingCall(method, future, on_event, caller=caller)
        # The deadline fails the future itself, rather than a timeout scope around the await (measurably cheaper).
        deadline = self._deadlines.call_later(timeout, _expire, future)
        if silence is not None and silence < timeout:
            pending.silence = silence
            pending.quiet = self._deadlines.call_later(silence, _fall_silent, future)
        try:
            if backlog:
                await self._drain_or_deadline(future)
            return await future
        except _Expired as expired:
            if cancel_on_timeout:
                await self._send_cancel(call_id, "timed out")
            if isinstance(expired, _Silent):
                raise CallTimedOut(
                    f"tool server {self.name!r} reported nothing on {method} for {silence:g}s",
                    {"server": self.name, "method": method, "timeout": silence, "silent": True},
                ) from None
            raise CallTimedOut(
                f"tool server {self.name!r} did not answer {method} within {timeout:g}s",
                {"server": self.name, "method": method, "timeout": timeout},
            ) from None
        except asyncio.CancelledError:
            if cancel_on_timeout:
                await asyncio.shield(self._send_cancel(call_id, "cancelled by the client"))
            raise
        finally:
            deadline.cancel()
            if pending.quiet is not None:
                pending.quiet.cancel()
            self._pending.pop(call_id, None)
            # A failed call's error holds this frame (its traceback), and the future held the error: dropped here,
            # that cycle does not keep the error, its frames and what they hold (the connection) for the collector.
            del future, pending

    def touch(self, call_id: int) -> None:
        """The call `call_id` showed activity (an update about it): its silence deadline starts again."""
        pending = self._pending.get(call_id)
        if pending is None or pending.silence is None or pending.future.done():
            return
        pending.quiet.cancel()
        if not pending.held:
            pending.quiet = self._deadlines.call_later(pending.silence, _fall_silent, pending.future)

    def hold(self, call_id: int, on: bool) -> None:
        """The call `call_id` starts (`on`) or ends a wait that is not silence: its silence deadline is off while any
        such wait is on, and starts again when the last one ends."""
        pending = self._pending.get(call_id)
        if pending is None or pending.silence is None:
            return
        pending.held += 1 if on else -1
        self.touch(call_id)

    async def _drain_or_deadline(self, future: asyncio.Future[Any]) -> None:
        """Wait for the child's stdin to take what waits in front of it, but not past the call's deadline (or
        answer): a child that stopped reading must not hold a call beyond its timeout."""
        drained = asyncio.ensure_future(self._process.drain())
        try:
            await asyncio.wait((drained, future), return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
        if drained.done() and not drained.cancelled() and (error := drained.exception()) is not None:
            raise error

    # -- the child's stdin backlog ---------------------------------------------------------

    def _check_backlog(self, backlog: int, method: str | None = None) -> bool:
        """Over the limit: start (or stay in) an episode, and refuse a message of `method` (raise
        ToolServerUnavailable), or tell a caller with no method that it is over (True). Under it: end an episode if
        one was on (False)."""
        if backlog <= self._backlog_limit:
            if self._stuck:
                self._stuck = False
                logger.info("server=%s pid=%d reads its stdin again: %d replies to its requests dropped, %d calls "
                            "refused so far", self.tag, self._process.pid, self.dropped.replies, self.dropped.calls)
            return False
        if not self._stuck:
            self._stuck = True
            logger.warning("server=%s pid=%d is not reading its stdin: %d bytes wait for it (limit %d); answers to "
                           "its requests are dropped and calls refused until it reads", self.tag, self._process.pid,
                           backlog, self._backlog_limit)
        if method is None:
            return True
        self.dropped.calls += 1
        # How much waits, and for whom, is the operators' to see (logged above), not the caller's.
        raise ToolServerUnavailable(
            f"tool server {self.name!r} is not reading what it is sent; {method} was not sent, retry later",
            {"server": self.name, "method": method},
        )

    async def _send_cancel(self, call_id: int, reason: str) -> None:
        if not self._process.alive:
            return
        with contextlib.suppress(ToolServerUnavailable):
            await self.notify("notifications/cancelled", {"requestId": call_id, "reason": reason})

    # -- receiving -------------------------------------------------------------------------

    def lines(self, lines: list[Line]) -> None:
        """Whole stdout lines as they arrive, handled in the pipe's own callback."""
        if self._on_activity is not None:
            self._on_activity()
        # By index, not enumerate(): an enumerate keeps its last (index, line) tuple for reuse, and with it the line.
        for index in range(len(lines)):
            # Only the text is kept while it is parsed: a large answer is not held as its bytes too.
            text = decode_line(lines[index])
            lines[index] = b""
            try:
                self._handle_line(text)
            except Exception:  # a bug must not end the pipe, and with it every later answer of the child
                logger.exception("server=%s pid=%d stdout line not handled", self.tag, self._process.pid)

    def _handle_line(self, text: str) -> None:
        try:
            message = parse_text(text)
        except NonFinite:
            self._non_finite(text)
            return
        except ValueError:
            logger.warning("server=%s pid=%d stdout is not JSON, dropped: %.200r", self.tag, self._process.pid, text)
            return
        if not isinstance(message, dict):
            logger.warning("server=%s pid=%d stdout message is not an object, dropped", self.tag, self._process.pid)
            return
        if "method" in message:
            self._handle_incoming(message)
        elif "id" in message:
            self._handle_response(message)
        else:
            logger.warning("server=%s pid=%d message with neither method nor id dropped", self.tag,
                           self._process.pid)

    def overlong(self, head: bytes, tail: bytes | None) -> None:
        """The child wrote a line over the limit (dropped, process.py `Lines`): told as it crosses the limit (`tail`
        None) and again once it ends. If its head, or its head and tail, say it answers a pending call, or it is a
        response while only one call waits, that call fails now instead of at its timeout."""
        call_id = answered_id(head, tail, self._alone())
        pending = self._pending.get(call_id) if call_id is not None else None
        if pending is None or pending.future.done():
            return
        pending.future.set_exception(unavailable(
            self.name, f"answered {pending.method} with a line over {MAX_LINE_BYTES} bytes", retryable=False))

    def _alone(self) -> int | None:
        """The id of the gateway's only request the child has not answered, if there is one alone."""
        if len(self._pending) != 1 or self._listens:
            return None
        return next(iter(self._pending))

    def _non_finite(self, line: str) -> None:
        """A line with a number JSON cannot carry: if it answers a pending call, that call fails now (it could not
        be sent on, and waiting for its timeout would not change that); otherwise it is dropped."""
        pid = self._process.pid
        try:
            # Read again, leniently, only to learn which call it answers.
            message = json.loads(line)
        except ValueError:
            message = None
        call_id = message.get("id") if isinstance(message, dict) and "method" not in message else None
        pending = self._pending.get(call_id) if isinstance(call_id, int) else None
        if pending is None or pending.future.done():
            logger.warning("server=%s pid=%d stdout holds a number JSON cannot carry, dropped: %.200r", self.tag,
                           pid, line)
            return
        logger.warning("server=%s pid=%d answered %s with a number JSON cannot carry: %.200r", self.tag, pid,
                       pending.method, line)
        pending.future.set_exception(unavailable(
            self.name, f"answered {pending.method} with a number JSON cannot carry (NaN, Infinity or out of range)",
            retryable=False,
        ))

    def _handle_response(self, message: dict[str, Any]) -> None:
        call_id = message.get("id")
        pending = self._pending.get(call_id) if isinstance(call_id, int) else None
        if pending is None or pending.future.done():
            ended = self._listens.pop(call_id, None) if isinstance(call_id, int) else None
            if ended is not None:
                ended(message)
                return
            logger.warning("server=%s pid=%d response with unknown id %.64r dropped", self.tag, self._process.pid,
                           call_id)
            return
        if "error" in message and isinstance(message["error"], dict):
            pending.future.set_exception(UpstreamError(message["error"]))
        elif "result" in message:
            pending.future.set_result(message["result"])
        else:
            pending.future.set_exception(
                unavailable(self.name, "sent a response with neither result nor error", retryable=False)
            )

    def _handle_incoming(self, message: dict[str, Any]) -> None:
        if "id" in message:
            self._answer_request(message)
            return
        sink = self._sink_for(message)
        if sink is not None:
            sink(message)
        elif self._on_notification is not None:
            self._on_notification(message)

    def _answer_request(self, message: dict[str, Any]) -> None:
        """Answer a request of the child, within its rate, unless its stdin is over the backlog limit."""
        if not self._requests.take():
            self._request_dropped()
            return
        if self._flooding and self._requests.full:
            self._flooding = False
            logger.info("server=%s pid=%d asks calmly again: %d of its requests dropped unanswered so far",
                        self.tag, self._process.pid, self.dropped.requests)
        child_id = message.get("id")
        reply: dict[str, Any] | None
        if not isinstance(child_id, str | int) or isinstance(child_id, bool):
            reply = _invalid(None, "a request id must be a string or an integer")
        elif child_id in self._awaiting:
            logger.warning("server=%s pid=%d reused the id %.64r of its own request still waiting for its reply: "
                           "refused", self.tag, self._process.pid, child_id)
            reply = _invalid(child_id, f"request id {child_id!r} is already in use by a request still waiting")
        else:
            # Marked before `on_request`, which may reply at once through `reply` (and so unmark it).
            self._awaiting.add(child_id)
            reply = self._on_request(message)
            if reply is None:
                return
            self._awaiting.discard(child_id)
        if self._check_backlog(self._process.backlog()):
            self.dropped.replies += 1
            return
        # The child may be gone by now; its exit fails what is pending, and its request needs no answer.
        with contextlib.suppress(ToolServerUnavailable):
            self._write(reply)

    def reply(self, message: dict[str, Any]) -> bool:
        """Send the reply to a request of the child that `on_request` left for later (it returned None): whether it
        was written. Not written when the child is gone (nothing waits for it) or over the stdin backlog limit
        (dropped, as any reply then)."""
        child_id = message.get("id")
        if isinstance(child_id, str | int):
            self._awaiting.discard(child_id)
        if not self._process.alive:
            return False
        if self._check_backlog(self._process.backlog()):
            self.dropped.replies += 1
            return False
        try:
            # Rare (a client's answer to a relayed question): looked through for a large string every time.
            self._write(message, jsontext.carries_large_string(message))
        except ToolServerUnavailable:
            return False
        return True

    def pending_for(self, message: dict[str, Any], guess: bool = True) -> PendingCall | None:
        """The call of the gateway a request of the child belongs to: the one its `_meta` names (by
        `io.modelcontextprotocol/related-request-id` or `progressToken`, the gateway's own id of the call), else
        (if `guess`) the only call in flight; None when it cannot be told."""
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict):
            for key in (RELATED_REQUEST, "progressToken"):
                named = meta.get(key)
                if isinstance(named, int) and not isinstance(named, bool) and named in self._pending:
                    return self._pending[named]
        if guess and len(self._pending) == 1:
            return next(iter(self._pending.values()))
        return None

    def _request_dropped(self) -> None:
        self.dropped.requests += 1
        if not self._flooding:
            self._flooding = True
            logger.warning("server=%s pid=%d sends requests faster than %g a second: the rest are dropped "
                           "unanswered", self.tag, self._process.pid, self._requests.rate)

    def _sink_for(self, message: dict[str, Any]) -> EventSink | None:
        """The call a notification belongs to: by progress token, or the only call in flight for a log line."""
        params = message.get("params")
        method = message.get("method")
        if method == "notifications/progress" and isinstance(params, dict):
            pending = self._pending.get(params.get("progressToken"))  # type: ignore[arg-type]
            return pending.on_event if pending else None
        if method == "notifications/message" and len(self._pending) == 1:
            # With several calls in flight a log line cannot be attributed; it goes to the daemon's log. Nor can one
            # written after the only call's answer (read in the same chunk, before the call let go of its entry).
            only = next(iter(self._pending.values()))
            return None if only.future.done() else only.on_event
        return None

    # -- failing ---------------------------------------------------------------------------

    def fail_calls(self, error: GatewayError) -> None:
        """Fail every call waiting on this child with `error` (the child keeps running until closed)."""
        for call_id, pending in list(self._pending.items()):
            if not pending.future.done():
                pending.future.set_exception(error)
            self._pending.pop(call_id, None)

    def exited(self, info: ExitInfo) -> None:
        """The child is gone: fail every call still waiting on it with how it ended."""
        for call_id, pending in list(self._pending.items()):
            if not pending.future.done():
                data: dict[str, Any] = {"server": self.name, "method": pending.method, "exit_status": info.returncode}
                if self._private:
                    # Only the child's own client sees its last words; a shared child's stay in the daemon's log.
                    data["stderr_tail"] = list(info.tail)
                pending.future.set_exception(ToolServerUnavailable(
                    f"tool server {self.name!r} exited during {pending.method} ({info.describe()})", data))
            self._pending.pop(call_id, None)
        # Nothing a gone child still wrote concerns its owner: its handlers (the owner's bound methods and closures,
        # each a reference cycle through this peer) are dropped, so the child's objects go by reference counting.
        self._on_notification = self._on_activity = None
        self._on_request = default_reply
        self._listens.clear()


class _Expired(Exception):
    """A call's deadline passed: set on its future by its timer."""


class _Silent(_Expired):
    """A call whose deadline follows its activity stayed silent too long."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Expired())


def _fall_silent(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Silent())
