"""The gateway's JSON-RPC peer on one child's stdio pipes: ids, pending calls, answers, the child's own messages.

Owns: the gateway's request ids toward the child, the table of calls waiting for an answer and
their deadlines, matching responses to them, the child's requests (answered by `on_request`, or
by `default_reply`) and notifications (routed to the call they belong to, or to the owner), and
failing the calls pending when the child is gone.
Does not own: the process, its pipes or its stop (process.py), MCP handshakes or restarts
(server.py). A response with an unknown id, or a stdout line that is not JSON, is logged and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gatewayd import jsonrpc
from gatewayd.deadlines import Deadlines
from gatewayd.errors import CallTimedOut, GatewayError, ToolServerUnavailable, UpstreamError
from gatewayd.upstream.process import ChildProcess, ExitInfo, unavailable

logger = logging.getLogger(__name__)

EventSink = Callable[[dict[str, Any]], None]
# Answers a request the child sent: the reply message to write back, or None to send nothing now.
RequestHandler = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass
class PendingCall:
    """A request sent to the child and waiting for its answer."""

    method: str
    future: asyncio.Future[Any]
    on_event: EventSink | None
    started: float = field(default_factory=time.monotonic)


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
    """

    def __init__(
        self,
        process: ChildProcess,
        *,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
        on_activity: Callable[[], None] | None = None,
        on_request: RequestHandler | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        self.name = process.name
        self.tag = process.tag
        self._process = process
        self._on_notification = on_notification
        self._on_activity = on_activity
        self._on_request = on_request or default_reply
        self._pending: dict[int, PendingCall] = {}
        self._next_id = 0
        self._outbox: list[bytes] = []
        # The calls' deadlines: one loop timer for many calls, not one per call.
        self._deadlines = deadlines or Deadlines()

    @property
    def in_flight(self) -> int:
        """Calls waiting for an answer."""
        return len(self._pending)

    # -- sending ---------------------------------------------------------------------------

    def _write(self, message: dict[str, Any]) -> None:
        """Queue one line for the child. Lines queued in the same loop turn go out in one write: one
        syscall and one wake-up of the child instead of one per call (measured: the pipe write was the
        largest single cost of a call under load)."""
        if not self._process.alive:
            raise unavailable(self.name, "is not running")
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self.flush)
        self._outbox.append(jsonrpc.dumps(message) + b"\n")

    def flush(self) -> None:
        """Write the lines queued so far, now."""
        lines, self._outbox = self._outbox, []
        self._process.write(b"".join(lines))

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification; nothing comes back."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._write(message)
        await self._process.drain()

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
    ) -> Any:
        """Send a request and wait for its result.

        Raises UpstreamError (the child's own error), CallTimedOut, or ToolServerUnavailable.
        On timeout or cancellation the call is forgotten and, if `cancel_on_timeout`, the child
        gets `notifications/cancelled`.
        """
        call_id = request_id if request_id is not None else self.new_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": call_id, "method": method}
        if params is not None:
            message["params"] = params
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._write(message)
        self._pending[call_id] = PendingCall(method, future, on_event)
        # The deadline fails the future itself, rather than a timeout scope around the await (measurably cheaper).
        deadline = self._deadlines.call_later(timeout, _expire, future)
        try:
            if self._process.backlogged():
                await self._process.drain()
            return await future
        except _Expired:
            if cancel_on_timeout:
                await self._send_cancel(call_id, "timed out")
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
            self._pending.pop(call_id, None)

    async def _send_cancel(self, call_id: int, reason: str) -> None:
        if not self._process.alive:
            return
        with contextlib.suppress(ToolServerUnavailable):
            await self.notify("notifications/cancelled", {"requestId": call_id, "reason": reason})

    # -- receiving -------------------------------------------------------------------------

    def lines(self, lines: list[bytes]) -> None:
        """Whole stdout lines as they arrive, handled in the pipe's own callback."""
        if self._on_activity is not None:
            self._on_activity()
        for line in lines:
            try:
                self._handle_line(line)
            except Exception:  # a bug must not end the pipe, and with it every later answer of the child
                logger.exception("server=%s pid=%d stdout line not handled", self.tag, self._process.pid)

    def _handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("server=%s pid=%d stdout is not JSON, dropped: %.200r", self.tag, self._process.pid, line)
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

    def _handle_response(self, message: dict[str, Any]) -> None:
        call_id = message.get("id")
        pending = self._pending.get(call_id) if isinstance(call_id, int) else None
        if pending is None or pending.future.done():
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
            reply = self._on_request(message)
            if reply is not None:
                # The child may be gone by now; its exit fails what is pending, and its request needs no answer.
                with contextlib.suppress(ToolServerUnavailable):
                    self._write(reply)
            return
        sink = self._sink_for(message)
        if sink is not None:
            sink(message)
        elif self._on_notification is not None:
            self._on_notification(message)

    def _sink_for(self, message: dict[str, Any]) -> EventSink | None:
        """The call a notification belongs to: by progress token, or the only call in flight for a log line."""
        params = message.get("params")
        method = message.get("method")
        if method == "notifications/progress" and isinstance(params, dict):
            pending = self._pending.get(params.get("progressToken"))  # type: ignore[arg-type]
            return pending.on_event if pending else None
        if method == "notifications/message" and len(self._pending) == 1:
            # With several calls in flight a log line cannot be attributed; it goes to the daemon's log.
            return next(iter(self._pending.values())).on_event
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
                pending.future.set_exception(
                    ToolServerUnavailable(
                        f"tool server {self.name!r} exited during {pending.method} ({info.describe()})",
                        {"server": self.name, "exit_status": info.returncode, "stderr_tail": info.stderr_tail},
                    )
                )
            self._pending.pop(call_id, None)


class _Expired(Exception):
    """A call's deadline passed: set on its future by its timer."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Expired())
