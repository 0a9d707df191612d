"""What the gateway needs of a tool server: the boundary between the pipeline and the upstream side.

Owns the `Upstream` interface (what a server offers, whether a method is gated, and the three ways to
reach it: a tool call answered as an MCP CallToolResult, a direct method call answered with the
server's own result, and a notification), `Delivery` (whose call it is, where the server's
notifications about it go, what must still hold when it is sent, and who its requests go to: a
`Caller`) and `ToolDef`, one thing a server offers. `server.ToolServer`
implements it over a supervised child, whatever its dialect (dialects.py); tests may implement it
in memory. Does not own any implementation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gatewayd.values import value

if TYPE_CHECKING:  # loaded with the first ACP agent (upstream/acp.py)
    from gatewayd.terminals import Terminals

# Receives the notifications a call's server sends about that call (progress, log lines).
EventSink = Callable[[dict[str, Any]], None]


class Caller(Protocol):
    """Who a server's own requests during one call are put to (relay.py): the caller who caused them."""

    def ask(
        self, server: str, allowed: Collection[str], message: dict[str, Any], call: asyncio.Future[Any] | None,
        reply: Callable[[dict[str, Any]], bool], withdrawn: asyncio.Future[Any] | None = None,
    ) -> dict[str, Any] | None:
        """Put the child's request `message` to the caller: the reply to write now (a refusal), or None when
        `reply` will carry it later. `allowed` is what the server may ask; `call` ends with the call (None: asked
        outside any call, by a per-session child of the caller's session); `withdrawn` ends when the child no
        longer wants the answer (it cancelled the task the gateway runs the request as, hosted.py)."""
        ...

    @property
    def capabilities(self) -> dict[str, Any]:
        """What the caller can be asked (its client capabilities, MCP 2026-07-28): a modern child is told so, and
        may answer with an input-required result (dialects.py). Read only for a modern child."""
        ...

    @property
    def log_level(self) -> str | None:
        """The least severe log level the caller hears (None: no log lines): a modern child is told it per request,
        and writes none without it."""
        ...

    def tell(self, status: str) -> None:
        """How the call's work goes, as its tool server says (a modern child's task's `statusMessage`): a caller
        polling a task of the gateway's is shown it."""
        ...

    @property
    def answers_input(self) -> bool:
        """Whether a modern child's input-required result reaches this caller as it is, answered by its own retry
        (a 2026-07-28 caller); else the gateway puts its questions to it (relay.put) and retries the child."""
        ...


class AgentHost(Protocol):
    """Who answers what an agent asks its client during a turn it runs for a call (agents.py): its permission
    requests, file reads and writes and terminals, decided for the call's caller; and, once the turn is over, for
    the session's client (`between_turns`)."""

    async def answer(self, server: str, message: dict[str, Any], terminals: Terminals | None) -> dict[str, Any]:
        """The reply to the agent's request `message` (under its own id): a result or an error, never a raise.
        `terminals`: where its `terminal/*` run, the turn's or its session's (upstream/acp.py decides which)."""
        ...

    def between_turns(self) -> AgentHost:
        """Who answers what the agent asks about the turn's session after the turn: the same client, no caller."""
        ...

    def tell(self, message: dict[str, Any]) -> str | None:
        """A log line (`notifications/message`) for the user of the turn's caller outside any call: on its MCP
        session's stream while that lasts, at the session's log level; nowhere else. The id of the session told."""
        ...


class SessionScope(Protocol):
    """The MCP session a call belongs to, as a per-session child (fleet.py) needs it: its id, its end, and how it
    hears the child's log lines outside any call."""

    @property
    def id(self) -> str:
        ...

    def on_end(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the session ends (at once if it has); returns a function that cancels this."""
        ...

    def hear(self, message: dict[str, Any]) -> None:
        """A log line of the session's own child outside any call, at the session's level."""
        ...


@value
class Delivery:
    """How one call is delivered: the client it is for (its share of the server's slots and queue is counted),
    where the server's notifications about it go, whether progress was asked for, and a check that raises when
    the call may no longer run (its permission was revoked while it waited for a slot), and who the server's own
    requests during the call are put to (None: nobody, they are refused)."""

    client: str = ""
    on_event: EventSink | None = None
    progress: bool = False
    still_allowed: Callable[[], None] | None = None
    caller: Caller | None = None
    # The caller's own deadline for the call, in seconds from now (None: only the configured timeout applies).
    timeout: float | None = None
    # What the child's `_meta` carries besides the progress token: the call's trace context, made only for a
    # dialect that sends it.
    trace: Callable[[], dict[str, Any]] | None = None
    # A task-augmented tool call's `task` (MCP 2025-11-25, tasks.py), sent to an MCP child as it came.
    task: dict[str, Any] | None = None
    # The caller's MCP session, if any: a server with `isolation = "session"` runs the call on that session's child.
    session: SessionScope | None = None
    # Who that child's own requests outside any call are put to (its session's client, relay.py); set only for a
    # server with `isolation = "session"`.
    owner: Caller | None = None
    # Who answers an agent's requests during the call (an ACP server only, agents.py); None: they are refused.
    host: AgentHost | None = None
    # The caller's answers to a modern child's input-required result (`inputResponses`, the child's `requestState`),
    # sent along with the retried request; None: not a retry.
    resume: dict[str, Any] | None = None
    # The arguments carry a string over jsontext.LARGE_STRING: the child's line is made from its bytes a part at a
    # time (peer.py), not by the per-character escaper.
    large: bool = False


# A delivery for calls nobody in particular makes (tests, tools that list themselves).
ANYONE = Delivery()


@dataclass(frozen=True)
class ToolDef:
    """One tool (MCP) or declared method (plain JSON-RPC) of a server."""

    method: str
    description: str
    input_schema: dict[str, Any]
    # The server's own MCP tool object, passed to agents verbatim except for its name.
    raw: dict[str, Any] | None = None


class Upstream(Protocol):
    """One tool server as the gateway's pipeline sees it."""

    @property
    def name(self) -> str:
        """The server's name (its tools.d file's stem): the first part of every canonical name."""
        ...

    @property
    def prefix(self) -> str:
        """What clients see before its tool names (`<prefix><separator><tool>`); "": its own names alone."""
        ...

    @property
    def protocol(self) -> str:
        """What it speaks: "mcp", "jsonrpc" or "acp" (its tools.d `protocol`)."""
        ...

    @property
    def isolation(self) -> str:
        """Who shares a child: "shared" (everyone), "client" or "session" (upstream/fleet.py)."""
        ...

    def needs_confirmation(self, method: str) -> bool:
        """Whether its tools.d file says every call of `method` waits for a person."""
        ...

    def is_dangerous(self, method: str) -> bool:
        """Whether a call of `method` may run only once its decision is durably in the audit log."""
        ...

    def task_mode(self, method: str) -> str:
        """Whether a 2026-07-28 caller's call of `method` may become a task (modern_tasks.py): "never", "optional" or
        "required", as its tools.d file says."""
        ...

    def deadline_for(self, method: str) -> float:
        """Seconds a call of `method` may run at most (its tools.d timeout, else the server's `call_timeout`)."""
        ...

    async def has_tool(self, method: str) -> bool:
        """Whether the server offers `method` (may start it, to ask)."""
        ...

    async def tools(self) -> list[ToolDef]:
        """Everything the server offers (may start it, to ask)."""
        ...

    def tools_known(self) -> list[ToolDef] | None:
        """What `tools` would answer without waiting (declared, or listed by the running child), the same list
        object; None when it would have to start or ask the child."""
        ...

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        """Call `tool` for an MCP `tools/call` with exactly `arguments`; the answer is an MCP CallToolResult (a
        tool's own failure included, as `isError: true`)."""
        ...

    async def call_method(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        """Call `method` directly with exactly `params`; the answer is the server's own result, its own error
        raised as UpstreamError."""
        ...

    async def surface(self, kind: str) -> list[dict[str, Any]]:
        """What the server lists besides tools, as its own MCP objects: `kind` is `resources`, `resourceTemplates` or
        `prompts` (surfaces.py); empty for a protocol that has none (may start it, to ask)."""
        ...

    def surface_known(self, kind: str) -> list[dict[str, Any]] | None:
        """What `surface` would answer without waiting (listed by the running child, or nothing for a protocol
        without surfaces), the same list object; None when it would have to start or ask the child."""
        ...

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        """Send an MCP request about the server's resources, prompts or completions (`resources/read`,
        `resources/subscribe`, `resources/unsubscribe`, `prompts/get`, `completion/complete`), or about one of its tasks
        (`tasks/get`, `tasks/result`, `tasks/cancel`), with exactly `params`;
        the answer is the server's own result, its own error raised as UpstreamError."""
        ...

    async def notify(self, method: str, params: Any, delivery: Delivery = ANYONE) -> bool:
        """Send `method` as a notification; False when the server's protocol has no such thing."""
        ...

    async def roots_changed(self, session: str) -> None:
        """The client of MCP session `session` says its roots changed: tell the children holding that session's
        roots (only a per-session child can: a shared one never gets one session's roots)."""
        ...
