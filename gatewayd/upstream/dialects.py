"""Upstream dialects: how the gateway speaks to one kind of tool server.

Owns each upstream protocol's side of the boundary: the start-up handshake, what the server offers
(asked of the child, or declared in its tools.d file), calling a tool (answered as an MCP
CallToolResult), calling a method directly (the child's own result), sending a notification, and
answering the requests a child sends unasked; ACP agents have their own module (acp.py), and
protocols.py picks a server's dialect. Does not own the child's lifecycle, admission or restarts
(server.py) or the pipes (connection.py).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any, ClassVar, Final

from gatewayd import __version__, jsontext, relay
from gatewayd.config.models import ServerConfig
from gatewayd.errors import (
    MISSING_CLIENT_CAPABILITY,
    CallTimedOut,
    GatewayError,
    InputNotRelayed,
    ToolFailed,
    ToolServerUnavailable,
    UpstreamError,
)
from gatewayd.modern import LOG_LEVEL_KEY, TASKS_EXTENSION
from gatewayd.surfaces import SUBSCRIBE, UNSUBSCRIBE
from gatewayd.upstream import child_tasks, hosted
from gatewayd.upstream.api import Caller, Delivery, ToolDef
from gatewayd.upstream.child_tasks import MAX_INPUT_ROUNDS, TaskDriver
from gatewayd.upstream.connection import Connection
from gatewayd.upstream.eras import Eras, Found
from gatewayd.upstream.hosted import HostedTasks
from gatewayd.upstream.listening import Listening
from gatewayd.upstream.peer import default_reply

logger = logging.getLogger(__name__)

# The MCP version the gateway offers its tool servers at `initialize` (the legacy era); it accepts whatever they
# answer.
UPSTREAM_PROTOCOL_VERSION = "2025-11-25"
# The stateless era (2026-07-28): a child that answers `server/discover` listing it is spoken to in it, every request
# carrying the `_meta` envelope; any other answer, error or silence is the legacy era (basic/transports/stdio.mdx).
MODERN_VERSION: Final = "2026-07-28"
DISCOVER = "server/discover"
# How long the era probe waits before falling back to `initialize`: a legacy child answers an unknown method at once,
# one that ignores it must not hold its start-up long (and, found legacy, is not probed again: eras.py).
DISCOVER_TIMEOUT = 5.0
LEGACY: Found = "legacy"
ENVELOPE_VERSION = "io.modelcontextprotocol/protocolVersion"
ENVELOPE_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
ENVELOPE_CLIENT = "io.modelcontextprotocol/clientInfo"
# The params a caller's retry of an input-required result carries to a modern child (SEP-2322).
RESUME_KEYS = frozenset({"inputResponses", "requestState"})
# A `tools/list` (or resources, templates, prompts list) that pages forever is cut off here.
MAX_TOOL_PAGES = 100
# Seconds a child has to acknowledge `tasks/cancel` of a task the gateway made for a call that ended first.
TASK_CANCEL_TIMEOUT: Final = 5.0
# The log level a modern child is told for a caller with a stream and no level of its own (a direct call's SSE
# answer carries every line).
ALL_LOGS: Final = "debug"
# The MCP list method of each kind of thing besides tools a server may offer (surfaces.py).
SURFACE_LISTS = {"resources": "resources/list", "resourceTemplates": "resources/templates/list",
                 "prompts": "prompts/list"}
# What the gateway can relay from an MCP child to the caller of a call (relay.py), declared at `initialize`; whether
# a request is relayed is the server's tools.d `relay`, and the caller's own declaration.
RELAYED_CAPABILITIES: dict[str, Any] = {
    "sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True},
}
# What a legacy child is told at `initialize` besides: it may send sampling and elicitation requests as tasks, which
# the gateway hosts (hosted.py).
HOSTED_TASKS: Final[dict[str, Any]] = {"requests": {"sampling": {"createMessage": {}}, "elicitation": {"create": {}}},
                       "list": {}, "cancel": {}}
# How a legacy child cancels a request of its own (cancellation.mdx).
CANCELLED: Final = "notifications/cancelled"
# The requests a child may send its client that the relay takes.
RELAYED_METHODS = frozenset({"sampling/createMessage", "elicitation/create", "roots/list"})
# A plain JSON-RPC result's text for the model.
_RESULT_TEXT = jsontext.encoder(separators=(", ", ": "))


class Dialect(abc.ABC):
    """One upstream protocol, spoken to the child of one server (`tag` names it in logs)."""

    # The protocol's name in tools.d and in `gatewayctl status`.
    protocol: ClassVar[str]
    # Whether the protocol has resources, resource templates, prompts and completion (surfaces.py); without them a
    # server lists none, and nothing is ever routed to it.
    offers_surfaces: ClassVar[bool] = False

    def __init__(self, name: str, config: ServerConfig, owner: Caller | None = None, eras: Eras | None = None,
                 era_key: str = "") -> None:
        self.name = name
        self.config = config
        # Who the child's requests outside any call go to: the session of a per-session child (fleet.py), else nobody.
        self.owner = owner
        # Whether the child ever asked for roots: only then is it told they changed.
        self.asked_roots = False
        # What the era probe found for this server's program (eras.py), shared by every child of the same config.
        self.eras = eras if eras is not None else Eras()
        self.era_key = era_key or name

    @property
    def era(self) -> str | None:
        """The MCP era the child was last spoken to in (`gatewayctl status`); None for a protocol without eras."""
        return None

    @property
    @abc.abstractmethod
    def declared(self) -> list[ToolDef] | None:
        """What the server offers, known without asking its child; None: ask it (`list_tools`)."""

    def declares(self, method: str) -> bool | None:
        """Whether the server offers `method`, known without asking its child; None: ask it."""
        return None

    @abc.abstractmethod
    async def handshake(self, conn: Connection, tag: str) -> list[ToolDef] | None:
        """Whatever the protocol does before the first call; what the child offers, if it said."""

    @abc.abstractmethod
    async def list_tools(self, conn: Connection, tag: str) -> list[ToolDef]:
        """Ask the child what it offers."""

    @abc.abstractmethod
    async def call_tool(self, conn: Connection, tool: str, arguments: Any, timeout: float, how: Delivery) -> Any:
        """An MCP `tools/call` of `tool`, answered as a CallToolResult."""

    @abc.abstractmethod
    async def call_method(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        """A direct call of `method`, answered with the child's own result."""

    @abc.abstractmethod
    def can_notify(self, method: str) -> bool:
        """Whether `method` may be sent as a notification (nothing comes back)."""

    async def list_surface(self, conn: Connection, kind: str, tag: str) -> list[dict[str, Any]]:
        """Ask the child for its `kind` (`resources`, `resourceTemplates`, `prompts`): none unless the protocol has
        them."""
        return []

    async def call_surface(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        """An MCP request about the child's resources, prompts, completions or tasks, answered with its own result."""
        raise UpstreamError({"code": -32601, "message": f"a {self.protocol} server has no {method}"})

    def on_request(self, message: dict[str, Any], conn: Connection | None = None) -> dict[str, Any] | None:
        """The answer to a request the child on `conn` sends unasked (its own id kept), or None when it is
        answered later (`conn.reply`). Both dialects answer `ping`; MCP relays what a client can answer (below);
        the rest is refused, so the child never waits."""
        return default_reply(message)

    def on_notification(self, message: dict[str, Any]) -> bool:
        """Whether the dialect took a notification the child sent outside any call's progress (ACP's updates of a
        turn); the server handles the rest."""
        return False

    async def notify(self, conn: Connection, method: str, params: Any, how: Delivery) -> None:
        """Send `method` as a notification (`can_notify` said it may be)."""
        await conn.notify(method, params, large=how.large)

    def settings_name(self, method: str) -> str:
        """The `[methods.NAME]` of tools.d whose timeouts a call of `method` takes."""
        return method

    def keeps_child(self) -> str | None:
        """Why the child must not be stopped idle though no call runs (an ACP agent's kept terminals), or None."""
        return None

    async def ended(self, conn: Connection) -> None:
        """The child on `conn` ended (exited, stopped or idled out): let go of what lived only as long as it."""
        return None


class McpDialect(Dialect):
    """An MCP server over stdio, of either era (its tools.d `era`): probed with `server/discover` (once per config,
    eras.py), a modern child (2026-07-28) gets the `_meta` envelope on every request and its results' `resultType`
    read (an input-required result goes to the caller, its retry back; a task of its own is driven to its end,
    child_tasks.py; its changes are heard on a listen, listening.py); a legacy one gets `initialize`. Then
    `tools/list` (paged), every call a `tools/call`."""

    protocol = "mcp"

    def __init__(self, name: str, config: ServerConfig, owner: Caller | None = None, eras: Eras | None = None,
                 era_key: str = "") -> None:
        super().__init__(name, config, owner, eras, era_key)
        # Whether the child speaks the stateless era; decided by each start's handshake.
        self.modern = False
        # Whether a handshake has decided the era yet (before, status shows none).
        self._spoken = False
        # The tools its last listing says run only as tasks (2025-11-25 `execution.taskSupport: "required"`): a call
        # of one that does not carry a caller's `task` runs through a task of the gateway's own (`_through_task`).
        self._task_only: frozenset[str] = frozenset()
        # Its `tasks/cancel` requests for tasks of the gateway's own whose call ended first (owned here, each bounded).
        self._cancels: set[asyncio.Task[Any]] = set()
        # The tasks this legacy child asked the gateway to host (hosted.py), made anew for each child.
        self._hosted: HostedTasks | None = None
        # Its requests put to a caller and not answered yet, by its own id: each one's withdrawal, should the child
        # cancel it (`notifications/cancelled`); made anew for each child.
        self._asking: dict[str | int, asyncio.Future[None]] = {}
        # What this modern child's `server/discover` says it offers (its capabilities), and whether that includes the
        # tasks extension (it may make tasks of its own).
        self._offers: dict[str, Any] = {}
        self._makes_tasks = False
        # Its tools that refused a call not declaring the extension (-32021): declared to them from then on, until the
        # child's tools are listed again.
        self._wants_tasks: set[str] = set()
        # A modern child tells of changes on the gateway's one `subscriptions/listen` on it; its own tasks are driven
        # to their end for the caller.
        self._listening = Listening(name, lambda params: self._params(params, None))
        self._tasks = TaskDriver(name, config.relay, lambda params, how: self._params(params, how, True), self._cancel)

    @property
    def declared(self) -> list[ToolDef] | None:
        return None

    @property
    def era(self) -> str | None:
        if not self._spoken:
            return None
        return MODERN_VERSION if self.modern else LEGACY

    async def _not_modern(self, conn: Connection, tag: str, timeout: float) -> str | None:
        """Why the child does not serve MCP 2026-07-28 per request (None: it does, its `server/discover` lists that
        version)."""
        try:
            result = await conn.call(DISCOVER, {"_meta": self._envelope(RELAYED_CAPABILITIES)}, timeout=timeout)
        except ToolServerUnavailable:
            raise  # the child died: no era to fall back to
        except GatewayError as exc:
            logger.debug("server=%s %s: %s; legacy era", tag, DISCOVER, exc)
            return f"its {DISCOVER} failed: {exc.message}"
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        if isinstance(versions, list) and MODERN_VERSION in versions:
            capabilities = result.get("capabilities")
            self._offers = capabilities if isinstance(capabilities, dict) else {}
            extensions = self._offers.get("extensions")
            self._makes_tasks = isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)
            return None
        return f"its {DISCOVER} does not list {MODERN_VERSION} (supportedVersions: {versions!r:.200})"

    async def _speaks_modern(self, conn: Connection, tag: str) -> bool:
        """Whether this start speaks the stateless era, as the server's `era` says: "legacy" never probes,
        "2026-07-28" must be answered so (else the start fails), "auto" probes unless the same config was found
        legacy before (eras.py)."""
        era = self.config.era
        if era == LEGACY:
            return False
        if era == MODERN_VERSION:
            why = await self._not_modern(conn, tag, self.config.startup_timeout)
            if why is not None:
                raise ToolServerUnavailable(
                    f"tool server {self.name!r} does not speak MCP {MODERN_VERSION}, which its tools.d key era "
                    f"requires: {why}; set era = \"auto\" or \"legacy\"",
                    {"server": self.name, "key": "era", "era": era})
            return True
        if self.eras.get(self.era_key) == LEGACY:
            logger.debug("server=%s found legacy before: %s skipped", tag, DISCOVER)
            return False
        modern = await self._not_modern(conn, tag, min(DISCOVER_TIMEOUT, self.config.startup_timeout)) is None
        self.eras.remember(self.era_key, MODERN_VERSION if modern else LEGACY)
        return modern

    def _envelope(self, capabilities: dict[str, Any]) -> dict[str, Any]:
        return {ENVELOPE_VERSION: MODERN_VERSION, ENVELOPE_CAPABILITIES: capabilities,
                ENVELOPE_CLIENT: {"name": "gatewayd", "version": __version__}}

    def _asks(self, how: Delivery | None, tasks: bool = False) -> dict[str, Any]:
        """The client capabilities a modern child is told of for one request: what its tools.d `relay` lets it ask,
        and the caller can answer (an input-required result is the caller's to answer); and the tasks extension when
        the gateway will drive a task of the child's (`tasks`)."""
        declared = how.caller.capabilities if how is not None and how.caller is not None else {}
        asks: dict[str, Any] = {kind: value for kind, value in declared.items() if kind in self.config.relay}
        if tasks:
            asks["extensions"] = {TASKS_EXTENSION: {}}
        return asks

    def _params(self, params: dict[str, Any], how: Delivery | None, tasks: bool = False) -> dict[str, Any]:
        """A request's params to a modern child: the envelope in its `_meta`, and the caller's answers to an
        input-required result, if this is the retry."""
        if not self.modern:
            return params
        meta = params.get("_meta")
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), **self._envelope(self._asks(how, tasks))}
        if how is not None and how.on_event is not None:
            # It writes log lines only when asked for them, as the caller is.
            level = how.caller.log_level if how.caller is not None else ALL_LOGS
            if level is not None:
                params["_meta"][LOG_LEVEL_KEY] = level
        if how is not None and how.resume:
            params.update({key: value for key, value in how.resume.items() if key in RESUME_KEYS})
        return params

    def _result(self, result: Any) -> Any:
        """A modern child's result as the pipeline takes it: a complete one without `resultType` (the modern era's
        answers get it back, web/modern.py; legacy callers never had it), an input-required one as it is."""
        if self.modern and isinstance(result, dict) and result.get("resultType") == "complete":
            result = {key: value for key, value in result.items() if key != "resultType"}
        return result

    async def handshake(self, conn: Connection, tag: str) -> list[ToolDef] | None:
        timeout = self.config.startup_timeout
        self.modern = await self._speaks_modern(conn, tag)
        # Its hosted tasks and open requests are this child's alone: a legacy child gets a table of its own below.
        self._hosted = None
        self._asking = {}
        self._spoken = True
        if self.modern:
            tools = await self.list_tools(conn, tag)
            logger.info("server=%s pid=%d ready: protocol %s (stateless), %d tools", tag, conn.pid, MODERN_VERSION,
                        len({tool.method for tool in tools}))
            self._listening.start(conn, self._offers)
            return tools
        try:
            result = await conn.call(
                "initialize",
                {
                    "protocolVersion": UPSTREAM_PROTOCOL_VERSION,
                    "capabilities": {**RELAYED_CAPABILITIES, "tasks": HOSTED_TASKS},
                    "clientInfo": {"name": "gatewayd", "version": __version__},
                },
                timeout=timeout,
            )
            self._hosted = HostedTasks(conn.reply)
            await conn.notify("notifications/initialized")
            tools = await self.list_tools(conn, tag)
        except UpstreamError as exc:
            # A child remembered legacy may have become modern-only: the next start probes it again.
            self.eras.forget(self.era_key)
            raise ToolServerUnavailable(
                f"tool server {self.name!r} refused the MCP handshake: {exc.message}", {"server": self.name}
            ) from exc
        version = result.get("protocolVersion") if isinstance(result, dict) else "?"
        logger.info("server=%s pid=%d ready: protocol %s, %d tools", tag, conn.pid, version,
                    len({tool.method for tool in tools}))
        return tools

    async def list_tools(self, conn: Connection, tag: str) -> list[ToolDef]:
        items = [item for item in await self._pages(conn, "tools/list", "tools", tag) if _valid_tool(item)]
        self._task_only = frozenset(item["name"] for item in items if not self.modern and _task_only(item))
        self._wants_tasks.clear()
        return [_tool_def(item) for item in items]

    async def call_tool(self, conn: Connection, tool: str, arguments: Any, timeout: float, how: Delivery) -> Any:
        call_id = conn.new_id()
        params: dict[str, Any] = {"name": tool, "arguments": arguments if arguments is not None else {}}
        meta = _meta(how, call_id)
        if meta:
            params["_meta"] = meta
        if self.modern:
            return await self._modern_call(conn, tool, params, call_id, timeout, how)
        if how.task is not None:
            # A task-augmented call (tasks.py): the child answers with a CreateTaskResult.
            params["task"] = how.task
        elif tool in self._task_only:
            return await self._through_task(conn, params, call_id, timeout, how)
        return await conn.call("tools/call", params, timeout=timeout, on_event=how.on_event, request_id=call_id,
                               cancel_on_timeout=True, caller=how.caller, large=how.large)

    async def _modern_call(self, conn: Connection, tool: str, params: dict[str, Any], call_id: int, timeout: float,
                           how: Delivery) -> Any:
        """A tool call of a modern child. The tasks extension is declared to a child that advertises it for a tool
        whose tools.d `task` lets it run long, or that refused a call without it (-32021: sent again declaring it,
        and so from then on): its answer may be a task of its own, which the gateway drives to its end for the caller
        (child_tasks.py), whoever the caller is. Its input-required results are `_answered`'s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        tasks = self._makes_tasks and (tool in self._wants_tasks or self.config.task_mode(tool) != "never")
        try:
            result = await conn.call(
                "tools/call", self._params(params, how, tasks), timeout=timeout, on_event=how.on_event,
                request_id=call_id, cancel_on_timeout=True, caller=how.caller, large=how.large)
        except UpstreamError as exc:
            if tasks or not _needs_tasks(exc.error):
                raise
            # The child runs this tool only as a task: it gets one, whatever it advertised.
            self._wants_tasks.add(tool)
            tasks, call_id = True, conn.new_id()
            if how.progress:
                params["_meta"]["progressToken"] = call_id
            result = await conn.call(
                "tools/call", self._params(params, how, tasks), timeout=max(0.0, deadline - loop.time()),
                on_event=how.on_event, request_id=call_id, cancel_on_timeout=True, caller=how.caller, large=how.large)
        result = await self._answered(conn, "tools/call", params, self._result(result),
                                      max(0.0, deadline - loop.time()), how, tasks)
        if isinstance(result, dict) and result.get("resultType") == child_tasks.CREATED:
            return await self._tasks.drive(conn, result, deadline, how)
        return result

    async def _through_task(self, conn: Connection, params: dict[str, Any], call_id: int, timeout: float,
                            how: Delivery) -> Any:
        """A call of a tool that runs only as a task, for a caller that asked for none (a legacy call without `task`,
        a modern one, a direct one): sent with a task of the gateway's own, whose result `tasks/result` waits for —
        the caller gets the tool's result as from any call. Its deadline, or the call's end, cancels the task."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        created = self._result(await conn.call(
            "tools/call", {**params, "task": {"ttl": int(timeout * 1000)}}, timeout=timeout, on_event=how.on_event,
            request_id=call_id, cancel_on_timeout=True, caller=how.caller, large=how.large))
        task = created.get("task") if isinstance(created, dict) else None
        task_id = task.get("taskId") if isinstance(task, dict) else None
        if not isinstance(task_id, str):
            return created  # answered at once after all
        try:
            return self._result(await conn.call(
                "tasks/result", {"taskId": task_id}, timeout=max(0.0, deadline - loop.time()), on_event=how.on_event,
                request_id=conn.new_id(), cancel_on_timeout=True, caller=how.caller))
        except BaseException:
            # Timed out, failed or cancelled: the child's task must not run on for nobody.
            if conn.alive:
                self._cancel(conn, task_id)
            raise

    def _cancel(self, conn: Connection, task_id: str) -> None:
        cancel = asyncio.ensure_future(conn.call("tasks/cancel", self._params({"taskId": task_id}, None, True),
                                                 timeout=TASK_CANCEL_TIMEOUT))
        self._cancels.add(cancel)
        cancel.add_done_callback(self._cancelled)

    def _cancelled(self, cancel: asyncio.Task[Any]) -> None:
        self._cancels.discard(cancel)
        if not cancel.cancelled() and cancel.exception() is not None:
            logger.info("server=%s tasks/cancel of a task of the gateway's own failed: %s", self.name,
                        cancel.exception())

    async def _answered(self, conn: Connection, method: str, params: dict[str, Any], result: Any, timeout: float,
                        how: Delivery, tasks: bool = False) -> Any:
        """A modern child's input-required results put to a legacy caller that can be asked on its stream
        (relay.put), and the request retried with the answers until the child answers otherwise (at most
        MAX_INPUT_ROUNDS rounds, all within the call's timeout); a caller nobody can ask (answered as plain JSON)
        gets an error, never a result of an era it does not speak. A modern caller answers them itself (web/modern.py);
        any other result is as it is."""
        if not self.modern or how.resume is not None or (requests := _asked(result)) is None:
            return result  # a legacy child asks its own questions (on_request): nothing more to do
        caller = how.caller
        if caller is None:
            raise InputNotRelayed(self.name, requests)
        if caller.answers_input:
            return result
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(MAX_INPUT_ROUNDS):
            try:
                async with asyncio.timeout_at(deadline):
                    answers = await relay.put(caller, self.name, self.config.relay, requests)
            except TimeoutError:
                raise CallTimedOut(f"tool server {self.name!r} did not finish within {timeout:g}s",
                                   {"server": self.name}) from None
            retry = {**params, "inputResponses": answers}
            if isinstance(result.get("requestState"), str):
                retry["requestState"] = result["requestState"]
            retry["_meta"] = {key: value for key, value in (params.get("_meta") or {}).items()
                              if key not in (ENVELOPE_VERSION, ENVELOPE_CAPABILITIES, ENVELOPE_CLIENT)}
            result = self._result(await conn.call(
                method, self._params(retry, how, tasks), timeout=max(0.0, deadline - loop.time()),
                on_event=how.on_event, request_id=conn.new_id(), cancel_on_timeout=True, caller=how.caller,
                large=how.large,
            ))
            if (requests := _asked(result)) is None:
                break
        return result

    def on_notification(self, message: dict[str, Any]) -> bool:
        """A legacy child cancelling a request of its own that a caller was asked: the question is withdrawn. A
        modern child's notifications come on the gateway's listen (listening.py)."""
        method = message.get("method")
        if method == CANCELLED:
            params = message.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            withdrawn = self._asking.pop(request_id, None) if isinstance(request_id, str | int) else None
            if withdrawn is not None and not withdrawn.done():
                withdrawn.set_result(None)
            return True
        return self.modern and self._listening.taken(message)

    async def call_method(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        # A direct `server.tool` call of an MCP server is its tool call; on this route a tool's failure is an error.
        result = await self.call_tool(conn, method, params, timeout, how)
        if isinstance(result, dict) and result.get("isError") is True:
            raise ToolFailed(result)
        return result

    def can_notify(self, method: str) -> bool:
        return False

    def on_request(self, message: dict[str, Any], conn: Connection | None = None) -> dict[str, Any] | None:
        """Sampling, elicitation and roots go to the caller of the call they belong to (relay.py), when one can be
        told; refused otherwise."""
        method = message.get("method")
        if method in hosted.METHODS and self._hosted is not None:
            return self._hosted.answer(message)  # about a request the gateway runs as a task for it
        if method not in RELAYED_METHODS or conn is None:
            return default_reply(message)
        if method == "roots/list":
            self.asked_roots = True
        # A per-session child's roots are its session's, not a call's: unless the child names a call, they are asked
        # on the session's stream, where the answer is not cut off by whichever call was in flight ending first.
        pending = conn.pending_for(message, guess=not (method == "roots/list" and self.owner is not None))
        caller = pending.caller if pending is not None else None
        if caller is None and self.owner is not None:
            # A per-session child asking outside a call its client can be asked in (at start-up, after a roots
            # change, during the gateway's own listing): its session's client is asked, on the session's stream.
            owner = self.owner
            return self._asked(message, lambda plain, reply, withdrawn: owner.ask(
                self.name, self.config.relay, plain, None, reply, withdrawn), conn)
        if pending is None or caller is None:
            why = "belongs to no call of a client that can be asked" if pending is not None else \
                "cannot be told apart from the other calls in flight, or none is"
            logger.info("server=%s %s refused: it %s", self.name, method, why)
            return {"jsonrpc": "2.0", "id": message.get("id"),
                    "error": {"code": -32601, "message": f"{method}: not relayed, it {why}"}}
        call = pending.future
        return self._asked(message, lambda plain, reply, withdrawn: caller.ask(
            self.name, self.config.relay, plain, call, reply, withdrawn), conn)

    def _asked(self, message: dict[str, Any], ask: hosted.Ask, conn: Connection) -> dict[str, Any] | None:
        """Put the child's request to its caller (`ask`): as a task the gateway hosts when the child sent it as one,
        else as it is."""
        if self._hosted is not None and hosted.augmented(message):
            return self._hosted.take(message, ask)
        child_id = message.get("id")
        if not isinstance(child_id, str | int):
            return ask(message, conn.reply, None)
        withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asking[child_id] = withdrawn

        def reply(answer: dict[str, Any]) -> bool:
            if self._asking.get(child_id) is withdrawn:
                del self._asking[child_id]
            # A request the child cancelled gets no response (cancellation.mdx): the question's end is the caller's.
            return True if withdrawn.done() else conn.reply(answer)

        refused = ask(message, reply, withdrawn)
        if refused is not None and self._asking.get(child_id) is withdrawn:
            del self._asking[child_id]
        return refused

    offers_surfaces = True

    async def list_surface(self, conn: Connection, kind: str, tag: str) -> list[dict[str, Any]]:
        return await self._pages(conn, SURFACE_LISTS[kind], kind, tag)

    async def _pages(self, conn: Connection, method: str, kind: str, tag: str) -> list[dict[str, Any]]:
        """Every item of a paged MCP list (`tools/list`, `resources/list`, …), following `nextCursor`."""
        items: list[dict[str, Any]] = []
        cursor: Any = None
        for _ in range(MAX_TOOL_PAGES):
            params = {"cursor": cursor} if cursor is not None else {}
            try:
                page = self._result(await conn.call(method, self._params(params, None),
                                                    timeout=self.config.startup_timeout))
            except UpstreamError as exc:
                # A server without the capability has nothing to list; that is not a failure.
                logger.info("server=%s %s refused: %s", tag, method, exc.message)
                break
            if not isinstance(page, dict) or not isinstance(page.get(kind, []), list):
                break
            items.extend(item for item in page.get(kind, []) if isinstance(item, dict))
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return items

    async def call_surface(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        if self.modern and method in (SUBSCRIBE, UNSUBSCRIBE):
            return self._listening.subscription(conn, method, params)
        call_id = conn.new_id()
        sent: dict[str, Any] = dict(params) if isinstance(params, dict) else {}
        meta = _meta(how, call_id)
        if meta:
            sent["_meta"] = meta
        # The caller goes along: a child may ask it something during any request (a task's questions come during
        # `tasks/result`, related to the task), and the relay decides as for a tool call.
        result = self._result(await conn.call(method, self._params(sent, how), timeout=timeout,
                                              on_event=how.on_event, request_id=call_id, cancel_on_timeout=True,
                                              caller=how.caller, large=how.large))
        return await self._answered(conn, method, sent, result, timeout, how)


class JsonRpcDialect(Dialect):
    """A plain JSON-RPC 2.0 server over stdio: no handshake, its methods declared in its tools.d file."""

    protocol = "jsonrpc"

    def __init__(self, name: str, config: ServerConfig, owner: Caller | None = None, eras: Eras | None = None,
                 era_key: str = "") -> None:
        super().__init__(name, config, owner, eras, era_key)
        self._declared = [ToolDef(method, declared.description, declared.input_schema)
                          for method, declared in config.methods.items()]

    @property
    def declared(self) -> list[ToolDef] | None:
        return self._declared

    def declares(self, method: str) -> bool | None:
        return method in self.config.methods

    async def handshake(self, conn: Connection, tag: str) -> list[ToolDef] | None:
        return None

    async def list_tools(self, conn: Connection, tag: str) -> list[ToolDef]:
        return self._declared

    async def call_tool(self, conn: Connection, tool: str, arguments: Any, timeout: float, how: Delivery) -> Any:
        try:
            result = await self.call_method(conn, tool, arguments, timeout, how)
        except UpstreamError as exc:
            # The tool's own failure is a result the model can read, not a protocol error.
            return {"content": [{"type": "text", "text": exc.message}], "isError": True,
                    "structuredContent": {"error": exc.error}}
        return _as_tool_result(result)

    async def call_method(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        if self.config.methods[method].notification:
            await conn.notify(method, params, large=how.large)
            return None
        call_id = conn.new_id()
        if how.progress and isinstance(params, dict) and "_meta" not in params:
            # `_meta` is MCP's: a plain JSON-RPC server gets one (progress token and trace context) only when progress
            # was asked for, as before. Arguments that have a `_meta` of their own were decided with it and go as they
            # are (then without progress).
            params = {**params, "_meta": _meta(how, call_id)}
        return await conn.call(method, params, timeout=timeout, on_event=how.on_event, request_id=call_id,
                               large=how.large)

    def can_notify(self, method: str) -> bool:
        return True


def _meta(how: Delivery, call_id: int) -> dict[str, Any]:
    """The `_meta` the child is sent: the call's trace context and, if progress was asked for, a progress token
    that is the gateway's own id (unique per child, whatever the clients chose)."""
    meta = how.trace() if how.trace is not None else {}
    if how.progress:
        meta["progressToken"] = call_id
    return meta


def _asked(result: Any) -> dict[str, Any] | None:
    """The input requests of a modern child's input-required result, or None for any other result."""
    if not isinstance(result, dict) or result.get("resultType") != "input_required":
        return None
    requests = result.get("inputRequests")
    return requests if isinstance(requests, dict) else None


def _needs_tasks(error: dict[str, Any]) -> bool:
    """Whether a child's error is -32021 naming the tasks extension: the call must declare it."""
    data = error.get("data")
    required = data.get("requiredCapabilities") if isinstance(data, dict) else None
    extensions = required.get("extensions") if isinstance(required, dict) else None
    return error.get("code") == MISSING_CLIENT_CAPABILITY and isinstance(extensions, dict) \
        and TASKS_EXTENSION in extensions


def _valid_tool(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str) and bool(item["name"])


def _task_only(item: dict[str, Any]) -> bool:
    """Whether a 2025-11-25 tool runs only as a task (`execution.taskSupport: "required"`)."""
    execution = item.get("execution")
    return isinstance(execution, dict) and execution.get("taskSupport") == "required"


def _tool_def(item: dict[str, Any]) -> ToolDef:
    schema = item.get("inputSchema")
    return ToolDef(
        item["name"],
        item.get("description") or "",
        schema if isinstance(schema, dict) else {"type": "object"},
        item,
    )


def _as_tool_result(result: Any) -> dict[str, Any]:
    """A plain JSON-RPC result as an MCP CallToolResult: text for the model, structure for programs."""
    structured = result if isinstance(result, dict) else {"result": result}
    return {"content": [{"type": "text", "text": _RESULT_TEXT(result)}],
            "structuredContent": structured, "isError": False}
