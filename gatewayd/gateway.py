"""Gateway.dispatch: the one path of a call, and the gateway's own MCP methods (initialize, tools/list, …).

Owns the pipeline every call to a tool server runs, in this order, each step in its own module:

    route     routing.route          the name → a canonical Target of the call's generation
    decide    authorize.authorize    policy.decide, recorded; raises for denied and unknown alike
    track     inflight.track         from here on `notifications/cancelled` or shutdown can stop it
    confirm   confirmation.confirm   a person approves it (only if the decision said so)
    forward   forwarding.forward     to the tool server (upstream/), re-serialized from what was authorized
    record    records.outcome        how it ended, for the audit log and the metrics

and turning what a step raises into the caller's JSON-RPC answer. The gateway's own lists (`tools/list`,
`resources/list`, `resources/templates/list`, `prompts/list`, `tasks/list`) are made whole for the caller and
answered a page at a time (paging.py). Resource, prompt and completion calls
(surfaces.py) run the same pipeline, routed to the server that owns their URI, prompt or reference; so do
`tasks/get`, `tasks/result` and `tasks/cancel` (tasks.py), routed to the server holding the task and decided as
the tool that created it. `rpc.discover` answers the client's OpenRPC document (discovery.py).
Does not own HTTP or sessions (web/), the policy (policy.py) or tool servers (upstream/).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gatewayd import __version__, calls, discovery, jsonrpc, surfaces, tasks
from gatewayd.authorize import authorize, still_allowed
from gatewayd.calls import Call, CallContext, Target
from gatewayd.catalog import Catalog
from gatewayd.confirmation import ConfirmationGate
from gatewayd.elicitations import URL_ELICITATION_REQUIRED
from gatewayd.errors import (
    GatewayError,
    InternalError,
    InvalidParams,
    MissingClientCapability,
    Overloaded,
    UpstreamError,
)
from gatewayd.forwarding import forward, send
from gatewayd.inflight import Inflight
from gatewayd.jsonrpc import Notification, Request, Response
from gatewayd.modern import TASKS_EXTENSION, InputRequired
from gatewayd.paging import Pager
from gatewayd.records import Records
from gatewayd.relay import Relay
from gatewayd.routing import route, route_surface
from gatewayd.sessions import LOG_LEVELS
from gatewayd.upstream.api import Delivery

if TYPE_CHECKING:
    from gatewayd.agents import Agents

logger = logging.getLogger(__name__)

SERVER_INFO = {"name": "gatewayd", "version": __version__}
ROOTS_CHANGED = "notifications/roots/list_changed"


class Gateway:
    """Answers parsed messages: the gateway's own MCP methods, and calls through the pipeline."""

    def __init__(self, catalog: Catalog, records: Records, gate: ConfirmationGate, inflight: Inflight,
                 owners: surfaces.Surfaces | None = None, relay: Relay | None = None,
                 pager: Pager | None = None) -> None:
        self.catalog = catalog
        # Cuts the gateway's list answers into pages (paging.py).
        self.pager = pager if pager is not None else Pager()
        self.surfaces = owners if owners is not None else surfaces.Surfaces(catalog)
        self.records = records
        self.gate = gate
        self.inflight = inflight
        # The requests tool servers send callers during their calls (sampling, elicitation, roots).
        self.relay = relay if relay is not None else Relay(records)
        # What ACP agents ask during their turns, answered for the turn's caller (agents.py); made, and agents.py
        # with its terminals imported, by the first call to an agent.
        self._agents: Agents | None = None
        # The tasks children hold for clients (tasks.py).
        self.tasks = tasks.Tasks()
        # Cancellations of tasks the table had no room for, running.
        self._cancelling: set[asyncio.Task[Any]] = set()

    # -- entry points ----------------------------------------------------------------------

    async def dispatch(self, ctx: CallContext, message: Request) -> dict[str, Any]:
        """Answer one request: a JSON-RPC response, success or error. Never raises GatewayError."""
        try:
            result = await self._answer(ctx, message)
        except InputRequired as exc:
            # A step needs the modern caller's input first (the confirmation gate's question): a result, not an error.
            return jsonrpc.result_response(message.id, exc.result())
        except GatewayError as exc:
            return jsonrpc.error_response(message.id, exc)
        except Exception:
            # A bug must not reach the caller as a 500 or a traceback: -32603, details in the log only.
            logger.exception("client=%s %s failed", ctx.principal.name, message.method)
            return jsonrpc.error_response(message.id, InternalError("Internal error"))
        return jsonrpc.result_response(message.id, result)

    async def notify(self, ctx: CallContext, message: Notification) -> None:
        """Handle a notification. Nothing is ever answered, not even an error."""
        if message.method == "notifications/cancelled":
            self.inflight.cancel(ctx, message.params)
            return
        if message.method == ROOTS_CHANGED:
            if ctx.session is not None:
                await self._roots_changed(ctx, ctx.session.id)
            return
        if message.method.startswith("notifications/"):
            return
        call = calls.direct(ctx, calls.NOTIFICATION, None, message.method, message.params)
        try:
            target = await route(call, self.catalog, self.records)
            await authorize(call, target, self.records)
            if not await send(call, target, still_allowed(call, target, self.records)):
                # MCP has no fire-and-forget tool call; running it and dropping the result would surprise.
                logger.info("client=%s notification %s dropped: MCP tools need a request", ctx.principal.name,
                            message.method)
                return
            self.records.outcome(call, "sent")
        except GatewayError as exc:
            logger.info("client=%s notification %s dropped: %s", ctx.principal.name, message.method, exc.message)

    async def _roots_changed(self, ctx: CallContext, session: str) -> None:
        """The session's client says its roots changed: the children that hold that session's roots (per-session
        children that asked for them, upstream/fleet.py) are told, and ask again."""
        for server in ctx.servers.values():
            try:
                await server.roots_changed(session)
            except (GatewayError, OSError) as exc:
                logger.info("server=%s not told the roots changed: %s", server.name, exc)

    def answer(self, ctx: CallContext, message: Response) -> None:
        """A client's response to a request the gateway sent it, routed by its id: a request a tool server relayed
        (relay.py, ids `gatewayd-relay-…`) or the approval question (confirmation.py, `gatewayd-approval-…`);
        anything else is dropped."""
        if not self.relay.answer(ctx, message):
            self.gate.answer(ctx, message)

    async def _answer(self, ctx: CallContext, message: Request) -> Any:
        method = message.method
        if method == "ping":
            return {}
        if method == "tools/list":
            at = self.pager.cursor(ctx.principal.name, method, message.params)
            listed = await self.catalog.list_tools(ctx.principal, ctx.servers)
            return self.pager.page(ctx.principal.name, method, listed, at)
        if method == "tools/call":
            call = _tool_call(ctx, message)
            if isinstance(call.params.get("task"), dict):
                return await self._task_call(call)
            return await self._call(call)
        if method == "logging/setLevel":
            return _set_level(ctx, message.params)
        if method in surfaces.METHODS:
            return await self._surface(ctx, message)
        if method in tasks.METHODS:
            return await self._task(ctx, message)
        if method == discovery.METHOD:
            return await discovery.document(ctx.current_principal(), ctx.servers)
        return await self._call(calls.direct(ctx, calls.DIRECT, message.id, method, message.params))

    def agents(self) -> Agents:
        """Who answers what ACP agents ask during their turns (agents.py), made on first use."""
        if self._agents is None:
            from gatewayd.agents import Agents

            self._agents = Agents(self.records, self.gate)
        return self._agents

    # -- the pipeline ----------------------------------------------------------------------

    async def _call(self, call: Call, target: Target | None = None, confirmed: bool = False) -> Any:
        """One call's whole path: route (unless already routed) → decide → track → confirm → forward → record.
        (`confirmed`: a person already approved what this call continues, a task's creation.)"""
        if target is None:
            target = await route(call, self.catalog, self.records)
        # Every way out of the block below records the outcome, or the folded decision (`unfinished`).
        confirm = await authorize(call, target, self.records, fold=True)
        if confirmed:
            confirm = None
        check = still_allowed(call, target, self.records)
        if call.ctx.tasks is not None and call.route == calls.TOOLS_CALL:
            call.task_mode = target.server.task_mode(target.method)
        if call.ctx.on_decided is not None:
            call.ctx.on_decided(call, check)
        try:
            with self.inflight.track(call):
                if call.task_mode == "required" and not call.ctx.tasks:
                    # The tool runs only as a task (its tools.d `task`), and this caller cannot take one.
                    raise MissingClientCapability(TASKS_EXTENSION, extension=True)
                if confirm is not None:
                    await self.gate.confirm(call, confirm)
                result = await forward(call, target, check, self.relay,
                                       self.agents() if target.server.protocol == "acp" else None)
        except GatewayError as exc:
            # What the caller got, and whose error it was: a tool server's own error is not the gateway's failure.
            self.records.outcome(call, exc.error_type, error_code=exc.caller_code(), error_source=exc.source)
            if isinstance(exc, UpstreamError) and exc.caller_code() == URL_ELICITATION_REQUIRED:
                # The caller is to complete an elicitation first: its completion, when told, is for this session.
                self.relay.url_elicitations.required(target.server.name, exc.error, call.ctx.session)
            raise
        except asyncio.CancelledError:
            self.records.outcome(call, "cancelled")
            raise
        except BaseException:
            self.records.unfinished(call)
            raise
        if isinstance(result, dict) and result.get("isError") is True:
            # A tool's own failure, answered as a result (tools/call): the caller got no error code.
            self.records.outcome(call, UpstreamError.error_type, error_source=UpstreamError.source)
        elif isinstance(result, dict) and result.get("resultType") == "input_required":
            # A modern child needs its caller's answers first (dialects.py): the retry is another call.
            self.records.outcome(call, InputRequired.error_type)
        else:
            self.records.outcome(call, "ok")
        return result

    async def _surface(self, ctx: CallContext, message: Request) -> Any:
        """Resources, templates, prompts, completion (surfaces.py): a list, or a call through the pipeline whose
        route is the MCP method and whose target is the server that owns the URI, prompt or reference."""
        method = message.method
        if method in surfaces.LISTS:
            at = self.pager.cursor(ctx.principal.name, method, message.params)
            return self.pager.page(ctx.principal.name, method,
                                   await self.surfaces.list(ctx.principal, ctx.servers, method), at)
        call = self.surfaces.call(ctx, message)
        session = ctx.session
        if method == surfaces.SUBSCRIBE and session is not None \
                and len(session.subscriptions) >= surfaces.MAX_SUBSCRIPTIONS:
            raise InvalidParams(f"this session holds {surfaces.MAX_SUBSCRIPTIONS} subscriptions: unsubscribe some")
        target = await route_surface(call, self.surfaces, self.records)
        key = (target.server.name, call.name)
        if method == surfaces.UNSUBSCRIBE and session is not None and self.surfaces.shared(session, key):
            # Another session still wants this URI's updates: only this one's subscription ends.
            self.surfaces.unsubscribed(session, key)
            return {}
        result = await self._call(call, target)
        if session is not None and method == surfaces.SUBSCRIBE:
            # Updates reach this session only for the server its subscription went to (surfaces.tell).
            self.surfaces.subscribed(session, key)
        elif session is not None and method == surfaces.UNSUBSCRIBE:
            self.surfaces.unsubscribed(session, key)
        return result

    async def _task_call(self, call: Call) -> Any:
        """A task-augmented `tools/call` (tasks.py): through the pipeline with its `task`; a CreateTaskResult is
        remembered and answered under the gateway's task id."""
        target = await route(call, self.catalog, self.records)
        client = call.ctx.principal.name
        self.tasks.admit(client)
        result = await self._call(call, target)
        task = tasks.created_task(result)
        if task is None:
            return result
        try:
            return self.tasks.created(target.server.name, target.method, call.arguments, client, call.ctx.session,
                                      result, task)
        except Overloaded:
            # The table filled while the call ran: the child's task would be nobody's, so it is cancelled.
            cancel = asyncio.create_task(target.server.call_surface(tasks.CANCEL, {"taskId": task["taskId"]},
                                                                    Delivery(client)))
            self._cancelling.add(cancel)
            cancel.add_done_callback(self._cancelled)
            raise

    def _cancelled(self, cancel: asyncio.Task[Any]) -> None:
        self._cancelling.discard(cancel)
        if not cancel.cancelled() and cancel.exception() is not None:
            logger.info("an unrecorded task's cancellation failed: %s", cancel.exception())

    async def _task(self, ctx: CallContext, message: Request) -> Any:
        """`tasks/list` from the table; `tasks/get`, `tasks/result`, `tasks/cancel` of the caller's own task through
        the pipeline, decided as the tool that created it (tasks.py)."""
        method, params = message.method, message.params
        if params is None and method == tasks.LIST:
            params = {}
        if not isinstance(params, dict):
            raise InvalidParams(f"{method} needs params")
        if method == tasks.LIST:
            at = self.pager.cursor(ctx.principal.name, method, params)
            principal = ctx.current_principal()
            listed = self.tasks.listed(principal, ctx.servers) if principal is not None else {"tasks": []}
            return self.pager.page(ctx.principal.name, method, listed, at)
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise InvalidParams(f"{method} needs params.taskId, a string")
        call = Call(ctx, method, message.id, task_id[:tasks.MAX_ID_CHARS], params, None, params.get("_meta"))
        entry = self.tasks.find(ctx.principal.name, task_id)
        server = ctx.servers.get(entry.server) if entry is not None else None
        if entry is None or server is None:
            self.records.decided(call, "deny", reason="unknown")
            raise tasks.unknown(task_id)
        # Rules see the arguments the task was created with; the child is sent its own id.
        call.arguments = entry.arguments
        call.sent = {**{key: value for key, value in params.items() if key != "_meta"}, "taskId": entry.child_id}
        target = Target(server, entry.tool, surface=True)
        call.method = target.canonical
        result = await self._call(call, target, confirmed=True)
        return self.tasks.answered(entry, method, result)

    # -- MCP methods -----------------------------------------------------------------------

    def initialize_result(self, version: str) -> dict[str, Any]:
        """The answer to MCP `initialize` once the session exists."""
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": True}, "logging": {},
                             "resources": {"subscribe": True, "listChanged": True}, "prompts": {"listChanged": True},
                             "completions": {},
                             "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
            "serverInfo": SERVER_INFO,
            "instructions": "Tools and prompts of several servers, each named "
                            f"<server prefix>{self.catalog.separator}<name> (some servers keep their own names); "
                            "resources keep their servers' URIs.",
        }


def _tool_call(ctx: CallContext, message: Request) -> Call:
    """The call an MCP `tools/call` makes: rules see its `arguments`."""
    params = message.params
    if not isinstance(params, dict):
        raise InvalidParams("tools/call needs params {name, arguments}")
    arguments = params.get("arguments", {})
    if not isinstance(arguments, dict):
        raise InvalidParams("tools/call params.arguments must be an object")
    name = params.get("name")
    if not isinstance(name, str):
        raise InvalidParams("tools/call needs params.name, a string")
    if "task" in params and not isinstance(params["task"], dict):
        raise InvalidParams("tools/call params.task must be an object")
    return Call(ctx, calls.TOOLS_CALL, message.id, name, params, arguments, params.get("_meta"))


def _set_level(ctx: CallContext, params: Any) -> dict[str, Any]:
    level = params.get("level") if isinstance(params, dict) else None
    if level not in LOG_LEVELS:
        raise InvalidParams(f"logging/setLevel: level must be one of {', '.join(LOG_LEVELS)}")
    if ctx.session is not None:
        ctx.session.log_level = level
    return {}
