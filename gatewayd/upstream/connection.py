"""One stdio tool server as server.py uses it: a child process and the JSON-RPC peer on its pipes.

Owns: putting the two together. The process hands its stdout lines straight to the peer, the peer
writes through the process, and the child's exit reaches the owner (`on_exit`) before the calls
pending on it fail.
Does not own: the process, its pipes or its stop (process.py), ids, pending calls or the child's
own messages (peer.py), MCP handshakes, restarts or idle timers (server.py), or who may call (policy.py).

Every call in flight fails at once when the child exits; a response with an unknown id, or
a stdout line that is not JSON, is logged and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gatewayd.deadlines import Deadlines
from gatewayd.upstream.peer import EventSink, Peer, RequestHandler
from gatewayd.upstream.process import ChildProcess, ExitInfo

__all__ = ["Connection", "EventSink", "ExitInfo"]


class Connection:
    """A running stdio child speaking newline-delimited JSON-RPC. Use `open()`, then `call`/`notify`, then `close()`.

    `on_notification` receives notifications that belong to no call; `on_activity` is called on
    any output so idle detection follows what the child does, not wall time; `on_exit` is called
    once the child has exited, before the calls pending on it fail; `on_request` answers a request
    the child sends (the reply to write back, or None), by default `peer.default_reply`.
    `call`, `notify`, `new_id`, `fail_calls`, `reply` (a reply `on_request` left for later), `pending_for`
    (the call a request of the child belongs to), `touch` (a call's activity) and `listen`/`unlisten` (a modern
    child's `subscriptions/listen`) are the peer's (see peer.Peer).
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
        on_activity: Callable[[], None] | None = None,
        on_exit: Callable[[Connection], None] | None = None,
        tag: str | None = None,
        deadlines: Deadlines | None = None,
        on_request: RequestHandler | None = None,
        private: bool = False,
    ) -> None:
        process = ChildProcess(
            name, argv, env=env, cwd=cwd, tag=tag, on_activity=on_activity, on_exit=self._child_exited
        )
        peer = Peer(
            process, on_notification=on_notification, on_activity=on_activity, on_request=on_request,
            deadlines=deadlines, private=private,
        )
        self._process = process
        self._peer = peer
        self._on_exit = on_exit
        # The peer fails its calls for the child's exit once: when the exit is seen, or else when close() ends.
        self._exit_told = False
        self.name = name
        # How log lines name this child: the server and the config generation it was started for.
        self.tag = process.tag
        self.argv, self.env, self.cwd = process.argv, process.env, process.cwd
        # The peer's own bound methods rather than wrappers around them: they are on every call's path, and a
        # wrapping coroutine would be one more frame for each call.
        self.call = peer.call
        self.notify = peer.notify
        self.new_id = peer.new_id
        self.fail_calls = peer.fail_calls
        self.reply = peer.reply
        self.pending_for = peer.pending_for
        self.touch = peer.touch
        self.hold = peer.hold
        self.listen = peer.listen
        self.unlisten = peer.unlisten

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self._process.pid

    @property
    def alive(self) -> bool:
        """Whether the child is running and not being stopped."""
        return self._process.alive

    @property
    def in_flight(self) -> int:
        """Calls waiting for an answer."""
        return self._peer.in_flight

    @property
    def exit_info(self) -> ExitInfo | None:
        """How the child ended; None while it runs."""
        return self._process.exit_info

    async def open(self) -> None:
        """Spawn the child in its own process group. Raises ToolServerUnavailable if it cannot start."""
        await self._process.open(self._peer.lines, self._peer.overlong)

    async def wait_exited(self, timeout: float | None) -> bool:
        """Whether the child exits (and its pending calls have failed) within `timeout` seconds (None: ever)."""
        return await self._process.wait_exited(timeout)

    async def close(self) -> ExitInfo:
        """Stop the child: close stdin, wait, SIGTERM the group, wait, SIGKILL. Every wait is bounded."""
        info = await self._process.close(self._peer.flush)
        if not self._exit_told:
            # The child's exit was never seen (its wait was cut off): what is still pending fails now.
            self._exit_told = True
            self._peer.exited(info)
        return info

    def _child_exited(self, info: ExitInfo) -> None:
        self._exit_told = True
        # The owner learns of the exit before any caller does, so its state is right when they see the error.
        if self._on_exit is not None:
            self._on_exit(self)
        self._peer.exited(info)
