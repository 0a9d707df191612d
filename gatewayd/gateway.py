"""Gateway.dispatch: route → decide → call, and the gateway's own MCP methods (tools/list, …).

Owns the one path from a parsed message to a tool server: resolving a direct
`server.method` or an MCP `tools/call {name}` to the same canonical target, asking
`policy.decide` once, and calling the server with the very params object that was authorized
(re-serialized on the way out, never the raw bytes). Also owns MCP aggregation (tool
names, deterministic order) and mapping a call's upstream events back to the caller.
Does not own HTTP, sessions or process supervision.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gatewayd import __version__, approvals, audit, jsonrpc, jsontext, policy
from gatewayd.config.models import ConfirmOptions, MethodConfig
from gatewayd.errors import (
    ArgumentsRefused,
    ConfirmationDenied,
    ConfirmationExpired,
    GatewayError,
    InternalError,
    InvalidParams,
    MethodNotFound,
    RequestCancelled,
    ShuttingDown,
    UnknownTool,
    UpstreamError,
)
from gatewayd.jsonrpc import Notification, Request, Response
from gatewayd.metrics import Metrics
from gatewayd.policy import Decision, Principal
from gatewayd.sessions import LOG_LEVELS, SESSION_ID_SHOWN, Session, Sessions
from gatewayd.upstream.pool import Pool
from gatewayd.upstream.server import ToolDef, ToolServer

logger = logging.getLogger(__name__)

# The route of a JSON-RPC notification (no id: no answer, not even an error).
NOTIFICATION = "notification"
# A call stopped at shutdown answers its caller within this long (it only has to write its error).
CANCEL_GRACE = 5.0
# LLM APIs reject tool names outside this alphabet and length (MCP's own guidance agrees).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SERVER_INFO = {"name": "gatewayd", "version": __version__}

Emit = Callable[[dict[str, Any]], None]
# Registers a callback for when the caller's connection goes away; returns a function that unregisters it.
OnDisconnect = Callable[[Callable[[], None]], Callable[[], None]]

# Arguments shown in an elicitation message are cut here; the full arguments are on the operators' channels.
ELICIT_ARGUMENTS_CHARS = 2000
# The one field of the form a client's user answers.
ELICIT_FIELD = "approve"
ELICIT_SCHEMA = {
    "type": "object",
    "properties": {ELICIT_FIELD: {
        "type": "boolean", "title": "Run this call once",
        "description": "Let this call run once, with exactly these arguments.", "default": False,
    }},
    "required": [ELICIT_FIELD],
}


@dataclass
class CallContext:
    """Who is calling, in which session, where the call's notifications go (None: nowhere), and how to
    learn that the caller went away (None: never known)."""

    principal: Principal
    session: Session | None = None
    emit: Emit | None = None
    on_disconnect: OnDisconnect | None = None


@dataclass(frozen=True)
class Target:
    """A canonical call target: one tool server and one of its methods."""

    server: ToolServer
    method: str

    @property
    def canonical(self) -> str:
        """`server.method`, the name policies match."""
        return f"{self.server.name}.{self.method}"


@dataclass(eq=False)
class _Inflight:
    """A call in flight and, once someone stops it, the error its caller gets instead of a result."""

    task: asyncio.Task[Any]
    reason: GatewayError | None = None

    def stop(self, reason: GatewayError) -> None:
        if self.reason is None:
            self.reason = reason
            self.task.cancel()


@dataclass
class _CallInfo:
    """One call on its way through: who, by which route, and what the audit log says about it."""

    ctx: CallContext
    route: str
    request_id: Any
    meta: Any
    method: str
    arguments: Any = None
    started: float = field(default_factory=time.monotonic)
    trace: str = ""
    # Set when the call needs a person's yes before it runs.
    confirm: ConfirmOptions | None = None
    _params_sha256: str | None = None

    def params_sha256(self) -> str:
        """The arguments' hash, computed once: the decision record and an approval both carry it."""
        if self._params_sha256 is None:
            self._params_sha256 = audit.params_hash(self.arguments)
        return self._params_sha256

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
            "trace_id": self.trace, **fields,
        }


class Gateway:
    """Routes, authorizes and forwards calls to the pool's tool servers."""

    def __init__(
        self, pool: Pool, tool_name_separator: str = "__", sessions: Sessions | None = None,
        audit_log: audit.AuditLog | None = None,
    ) -> None:
        self.pool = pool
        self.sessions = sessions
        self.audit = audit_log or audit.AuditLog(None)
        self.approvals = approvals.Approvals()
        self.metrics = Metrics()
        # Where a person can approve on the web, told to waiting callers (None: no page).
        self.approval_url: str | None = None
        self.separator = tool_name_separator
        # Elicitations sent to callers, by (client, session id, request id): who gets the client's answer.
        self._elicitations: dict[tuple[str, str, str], Callable[[Response], None]] = {}
        self._inflight: dict[tuple[str, str, str], _Inflight] = {}
        self._calls: set[_Inflight] = set()
        self.closing = False

    # -- entry points ----------------------------------------------------------------------

    async def dispatch(self, ctx: CallContext, message: Request) -> dict[str, Any]:
        """Answer one request: a JSON-RPC response, success or error. Never raises GatewayError."""
        try:
            result = await self._route(ctx, message)
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
            self._cancel(ctx, message.params)
            return
        if message.method.startswith("notifications/"):
            return
        info = _CallInfo(ctx, NOTIFICATION, None, _meta_of(message.params), message.method)
        try:
            target = await self._direct_target(info, message.params)
            if target.server.config.protocol == "mcp":
                # MCP has no fire-and-forget tool call; running it and dropping the result would surprise.
                logger.info("client=%s notification %s dropped: MCP tools need a request", ctx.principal.name,
                            message.method)
                return
            await target.server.notify(target.method, message.params)
            self._outcome(info, "sent")
        except GatewayError as exc:
            logger.info("client=%s notification %s dropped: %s", ctx.principal.name, message.method, exc.message)

    def answer(self, ctx: CallContext, message: Response) -> None:
        """A client's response to a request the gateway sent it (an elicitation); anything else is dropped."""
        deliver = self._elicitations.pop(_request_key(ctx, message.id), None)
        if deliver is None:
            logger.debug("client=%s response to unknown id %.64r dropped", ctx.principal.name, message.id)
            return
        deliver(message)

    async def _route(self, ctx: CallContext, message: Request) -> Any:
        method = message.method
        if method == "ping":
            return {}
        if method == "tools/list":
            return await self.list_tools(ctx.principal)
        if method == "tools/call":
            return await self._tools_call(ctx, message)
        if method == "logging/setLevel":
            return _set_level(ctx, message.params)
        info = _CallInfo(ctx, "direct", message.id, _meta_of(message.params), method)
        target = await self._direct_target(info, message.params)
        return await self._tracked(info, functools.partial(self._direct_call, ctx, target, message.params))

    def initialize_result(self, version: str) -> dict[str, Any]:
        """The answer to MCP `initialize` once the session exists."""
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": True}, "logging": {}},
            "serverInfo": SERVER_INFO,
            "instructions": f"Tools of several servers, each named <server>{self.separator}<tool>.",
        }

    def tools_changed(self, server: str) -> None:
        """A server's tool list changed: tell every session on its GET stream."""
        if self.sessions is not None:
            logger.info("server=%s tools changed; notifying sessions", server)
            # Only clients that may see the server learn that it changed.
            self.sessions.broadcast({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"},
                                    to=lambda session: policy.may_see_server(session.principal, server))

    # -- routing ---------------------------------------------------------------------------

    async def _direct_target(self, info: _CallInfo, params: Any) -> Target:
        """The target of a direct `server.method` call; unknown and denied raise the same MethodNotFound."""
        server_name, dot, rest = info.method.partition(".")
        if not dot:
            self._decided(info, "deny", reason="unknown")
            raise MethodNotFound(info.method)
        return await self._resolve(info, server_name, rest, _arguments(params), functools.partial(MethodNotFound,
                                                                                                   info.method))

    async def _tool_target(self, info: _CallInfo, name: Any, arguments: dict[str, Any]) -> Target:
        """The target of `tools/call {name}`; unknown and denied raise the same UnknownTool."""
        if not isinstance(name, str):
            raise InvalidParams("tools/call needs params.name, a string")
        server_name, sep, rest = name.partition(self.separator)
        if not sep or not TOOL_NAME.fullmatch(name):
            self._decided(info, "deny", reason="unknown")
            raise UnknownTool(name)
        return await self._resolve(info, server_name, rest, arguments, functools.partial(UnknownTool, name))

    async def _resolve(
        self, info: _CallInfo, server_name: str, method: str, arguments: Any, unknown: Callable[[], GatewayError]
    ) -> Target:
        """The one decision for a call, recorded before anything runs.

        Deny and absence alike raise what `unknown` makes (made only then: an exception is costly to make on
        every call); a call that needs confirmation gets `info.confirm` and waits for a person once tracked
        (_confirm); a dangerous call runs only once its decision is durably in the audit log.
        """
        info.arguments = arguments
        server = self.pool.get(server_name)
        if server is None:
            self._decided(info, "deny", reason="unknown")
            raise unknown()
        target = Target(server, method)
        info.method = target.canonical
        verdict = policy.decide(info.ctx.principal, target.canonical, arguments,
                                confirm_required=server.config.needs_confirmation(method))
        if verdict.decision is Decision.DENY and not verdict.refused_arguments:
            self._decided(info, "deny", reason=verdict.reason)
            raise unknown()
        # Only a client that may call the method learns whether it exists (and may make the server start).
        if not await server.has_tool(method):
            self._decided(info, "deny", reason="unknown")
            raise unknown()
        rule = verdict.rule.describe() if verdict.rule else None
        if verdict.refused_arguments:
            assert verdict.rule is not None
            self._decided(info, "deny", rule=rule, reason="arguments")
            raise ArgumentsRefused(f"{target.canonical}: argument {verdict.rule.argument!r} breaks the policy rule "
                                   f"{verdict.rule.check}", {"rule": rule})
        if verdict.decision is Decision.CONFIRM and info.route == NOTIFICATION:
            # Nobody waits for a notification, so nobody could be told a person's answer: it never runs.
            self._decided(info, "deny", rule=rule, reason="needs confirmation, and a notification cannot wait")
            raise ConfirmationDenied(f"{target.canonical} needs a person's confirmation: send it as a request",
                                     {"method": target.canonical})
        if verdict.decision is Decision.CONFIRM:
            await self._decided_durably(info, "confirm", rule=rule, reason=verdict.reason)
            info.confirm = policy.confirm_options(info.ctx.principal, verdict, target.canonical)
            return target
        if server.config.is_dangerous(method):
            await self._decided_durably(info, "allow", rule=rule)
        else:
            self._decided(info, "allow", rule=rule)
        return target

    def _decided(self, info: _CallInfo, decision: str, **fields: Any) -> None:
        """Record a decision; the record is queued, not waited for. (Plain functions, not coroutines, record what
        need not be on disk first: they are on every call's path.)"""
        if decision == "deny":
            self.metrics.observe_denied()
        if self.audit.enabled:
            self.audit.queue(self._decision(info, decision, fields))

    async def _decided_durably(self, info: _CallInfo, decision: str, **fields: Any) -> None:
        """Record a decision that must be on disk before the call runs, or raise AuditUnavailable."""
        if self.audit.enabled:
            await self.audit.record(self._decision(info, decision, fields), durable=True)

    def _decision(self, info: _CallInfo, decision: str, fields: dict[str, Any]) -> dict[str, Any]:
        return info.record("decision", decision=decision, params_sha256=info.params_sha256(),
                           params=audit.summarize(info.arguments), **fields)

    def _outcome(self, info: _CallInfo, status: str, **fields: Any) -> None:
        seconds = time.monotonic() - info.started
        server, _, method = info.method.partition(".")
        self.metrics.observe_call(server, method, status, seconds)
        if self.audit.enabled:
            self.audit.queue(info.record("outcome", status=status, duration_ms=round(seconds * 1000, 3), **fields))

    def tool_name(self, server: str, method: str) -> str | None:
        """The MCP tool name for `server.method`, or None when it cannot be a valid one."""
        name = f"{server}{self.separator}{method}"
        return name if TOOL_NAME.fullmatch(name) else None

    async def _visible_tools(self, principal: Principal, server: ToolServer) -> list[ToolDef]:
        """The server's tools this principal may call (or call after confirmation)."""
        if not policy.may_see_server(principal, server.name):
            return []
        tools = await server.tools()
        return [t for t in tools if self._listing(principal, server, t) is not Decision.DENY]

    def _listing(self, principal: Principal, server: ToolServer, tool: ToolDef) -> Decision:
        return policy.may_call(principal, f"{server.name}.{tool.method}",
                               confirm_required=server.config.needs_confirmation(tool.method))

    # -- MCP methods -----------------------------------------------------------------------

    async def list_tools(self, principal: Principal) -> dict[str, Any]:
        """Every tool the principal may call, across servers, in a deterministic order."""
        servers = [s for s in self.pool.servers.values() if policy.may_see_server(principal, s.name)]
        listed = await asyncio.gather(*(self._visible_tools(principal, s) for s in servers), return_exceptions=True)
        tools: list[dict[str, Any]] = []
        for server, result in zip(servers, listed, strict=True):
            if isinstance(result, BaseException):
                logger.warning("server=%s left out of tools/list: %s", server.name, result)
                continue
            tools.extend(self._describe(principal, server, tool) for tool in sorted(result, key=lambda t: t.method))
        return {"tools": [tool for tool in tools if tool]}

    def _describe(self, principal: Principal, server: ToolServer, tool: ToolDef) -> dict[str, Any]:
        name = self.tool_name(server.name, tool.method)
        if name is None:
            logger.warning("server=%s tool %r has no valid MCP name; call it directly", server.name, tool.method)
            return {}
        if tool.raw is not None:
            described = {**tool.raw, "name": name}
        else:
            described = {"name": name, "inputSchema": tool.input_schema}
            if tool.description:
                described["description"] = tool.description
        if self._listing(principal, server, tool) is Decision.CONFIRM:
            _mark_confirm(described)
        return described

    async def _tools_call(self, ctx: CallContext, message: Request) -> Any:
        params = message.params
        if not isinstance(params, dict):
            raise InvalidParams("tools/call needs params {name, arguments}")
        arguments = params.get("arguments", {})
        if not isinstance(arguments, dict):
            raise InvalidParams("tools/call params.arguments must be an object")
        info = _CallInfo(ctx, "tools/call", message.id, params.get("_meta"), str(params.get("name")))
        target = await self._tool_target(info, params.get("name"), arguments)
        call = functools.partial(self._tool_call, ctx, target, arguments, params.get("_meta"))
        return await self._tracked(info, call)

    async def _tool_call(self, ctx: CallContext, target: Target, arguments: dict[str, Any], meta: Any) -> Any:
        events, progress = _event_mapper(ctx, meta)
        server = target.server
        if server.config.protocol == "mcp":
            return await server.call(target.method, arguments, on_event=events, progress=progress)
        declared = server.config.methods[target.method]
        try:
            result = await self._call_jsonrpc(server, target.method, declared, arguments, events, progress)
        except UpstreamError as exc:
            # The tool's own failure is a result the model can read, not a protocol error.
            return {"content": [{"type": "text", "text": exc.message}], "isError": True, "structuredContent": {
                "error": exc.error}}
        return _as_tool_result(result)

    async def _call_jsonrpc(
        self, server: ToolServer, method: str, declared: MethodConfig, params: Any, events: Emit | None, progress: bool
    ) -> Any:
        if declared.notification:
            await server.notify(method, params)
            return None
        return await server.call(method, params, on_event=events, progress=progress)

    async def _direct_call(self, ctx: CallContext, target: Target, params: Any) -> Any:
        meta = params.get("_meta") if isinstance(params, dict) else None
        events, progress = _event_mapper(ctx, meta)
        server = target.server
        if server.config.protocol == "mcp":
            return await server.call(target.method, _arguments(params), on_event=events, progress=progress)
        return await self._call_jsonrpc(
            server, target.method, server.config.methods[target.method], params, events, progress
        )

    # -- confirmation ----------------------------------------------------------------------

    async def _confirm(self, info: _CallInfo, options: ConfirmOptions) -> None:
        """Hold the call until a person approves it; raise if they deny, nobody answers, or the caller goes.

        Operators are always asked (gatewayctl, and the web page if the policy says so); the caller's own user
        too when its session can answer an elicitation on this call's stream. A call an operator allowed again
        (same client, method and arguments, within the time they gave) is approved without asking.
        """
        ctx = info.ctx
        channels = frozenset(options.channels)
        ask_client = approvals.CLIENT in channels and ctx.emit is not None and ctx.session is not None \
            and ctx.session.supports_form_elicitation()
        approval = self.approvals.open(
            client=ctx.principal.name, method=info.method, arguments=info.arguments,
            params_sha256=info.params_sha256(), session_id=ctx.session.id if ctx.session else None,
            channels=channels if ask_client else channels - {approvals.CLIENT}, timeout=options.timeout,
        )
        undo: list[Callable[[], None]] = []
        try:
            await self._audit_approval(info, "approval_requested", approval, durable=True)
            standing = self.approvals.standing_for(approval)
            if standing is not None:
                # An operator said this very call may run again for a while: nobody is asked this time.
                self.approvals.approve_standing(approval, standing)
            else:
                undo.extend(self._withdraw_when_gone(ctx, approval))
                self._announce(ctx, approval)
                if ask_client:
                    undo.append(self._elicit(ctx, approval))
                await self.approvals.wait(approval)
        finally:
            for step in undo:
                step()
            if approval.state is approvals.State.PENDING:
                # Failed before anyone could answer (the audit record could not be written, say): nobody may
                # approve a call that is no longer waiting.
                self.approvals.withdraw(approval, "the call ended before an answer")
        await self._audit_approval(info, "approval_decided", approval, durable=True)
        _raise_unless_approved(approval)

    def _withdraw_when_gone(self, ctx: CallContext, approval: approvals.Approval) -> list[Callable[[], None]]:
        """Withdraw the approval if the caller disconnects or its session ends; returns how to stop watching."""
        undo = []
        if ctx.on_disconnect is not None:
            undo.append(ctx.on_disconnect(lambda: self.approvals.withdraw(approval, "the caller disconnected")))
        if ctx.session is not None:
            undo.append(ctx.session.on_end(lambda: self.approvals.withdraw(approval, "the caller's session ended")))
        return undo

    def _announce(self, ctx: CallContext, approval: approvals.Approval) -> None:
        """Tell an SSE caller its call waits for approval: which id, until when, and where to approve it."""
        if ctx.emit is None or (ctx.session is not None and not ctx.session.wants_log("notice")):
            return
        data = {"event": "approval_pending", "approval_id": approval.id, "method": approval.method,
                "deadline": approval.deadline, "approve_with": f"gatewayctl approve {approval.id}"}
        if self.approval_url and approvals.WEB in approval.channels:
            data["approval_page"] = self.approval_url
        ctx.emit({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "notice", "logger": "gatewayd.approvals", "data": data}})

    def _elicit(self, ctx: CallContext, approval: approvals.Approval) -> Callable[[], None]:
        """Ask the caller's user on the call's stream; their answer decides like an operator's would."""
        assert ctx.emit is not None and ctx.session is not None
        request_id = f"gatewayd-approval-{approval.id}"
        key = _request_key(ctx, request_id)
        shown = json.dumps(approval.arguments, ensure_ascii=False)
        if len(shown) > ELICIT_ARGUMENTS_CHARS:
            shown = shown[:ELICIT_ARGUMENTS_CHARS] + f"… ({len(shown) - ELICIT_ARGUMENTS_CHARS} more characters)"
        message = (f"{approval.client} wants to run {approval.method} with arguments {shown}. "
                   f"Allow it to run once? (approval {approval.id})")
        who = f"the user of client {approval.client} (elicitation)"

        def deliver(response: Response) -> None:
            approve, reason = _elicitation_verdict(response)
            self.approvals.decide(approval.id, approve=approve, by=who, channel=approvals.CLIENT, reason=reason)

        self._elicitations[key] = deliver
        emit = ctx.emit
        emit({"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create",
              "params": {"mode": "form", "message": message, "requestedSchema": ELICIT_SCHEMA}})

        def withdraw_question() -> None:
            # Settled some other way (an operator, expiry, withdrawal): let the client close its question.
            if self._elicitations.pop(key, None) is not None:
                emit({"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": request_id, "reason": f"approval {approval.state.value}"}})

        return withdraw_question

    async def _audit_approval(self, info: _CallInfo, event: str, approval: approvals.Approval, *,
                              durable: bool) -> None:
        if not self.audit.enabled:
            return
        fields: dict[str, Any] = {"approval_id": approval.id, "state": approval.state.value}
        if approval.state is approvals.State.PENDING:
            fields.update(channels=sorted(approval.channels), timeout_s=approval.timeout,
                          params_sha256=approval.params_sha256)
        else:
            fields.update(decided_by=approval.decided_by, channel=approval.channel, reason=approval.reason)
        await self.audit.record(info.record(event, **fields), durable=durable)

    # -- cancellation ----------------------------------------------------------------------

    async def _tracked(self, info: _CallInfo, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run an authorized call so `notifications/cancelled` or shutdown can stop it; record its outcome."""
        try:
            result = await self._stoppable(info, call)
        except GatewayError as exc:
            self._outcome(info, exc.error_type, error_code=exc.code)
            raise
        except asyncio.CancelledError:
            self._outcome(info, "cancelled")
            raise
        is_error = isinstance(result, dict) and result.get("isError") is True
        self._outcome(info, "tool_error" if is_error else "ok")
        return result

    async def _stoppable(self, info: _CallInfo, call: Callable[[], Awaitable[Any]]) -> Any:
        if self.closing:
            raise ShuttingDown("gatewayd is shutting down; retry shortly")
        task = asyncio.current_task()
        assert task is not None
        key = _request_key(info.ctx, info.request_id)
        entry = _Inflight(task)
        self._inflight[key] = entry
        self._calls.add(entry)
        try:
            if info.confirm is not None:
                await self._confirm(info, info.confirm)
            return await call()
        except asyncio.CancelledError:
            # Our own cancel (client or shutdown) becomes an answer; anyone else's propagates.
            if entry.reason is not None and task.uncancel() == 0:
                raise entry.reason from None
            raise
        finally:
            self._calls.discard(entry)
            if self._inflight.get(key) is entry:
                del self._inflight[key]

    async def drain(self, grace: float) -> None:
        """Refuse new calls; give those in flight `grace` seconds, then cancel them (each gets an error answer)."""
        self.closing = True
        if not self._calls:
            return
        logger.info("waiting up to %gs for %d calls in flight", grace, len(self._calls))
        await asyncio.wait({entry.task for entry in self._calls}, timeout=grace)
        left = list(self._calls)
        if not left:
            return
        logger.warning("cancelling %d calls still running after %gs", len(left), grace)
        for entry in left:
            entry.stop(ShuttingDown("gatewayd stopped before the call finished"))
        await asyncio.wait({entry.task for entry in left}, timeout=CANCEL_GRACE)

    def _cancel(self, ctx: CallContext, params: Any) -> None:
        if not isinstance(params, dict) or "requestId" not in params:
            return
        entry = self._inflight.get(_request_key(ctx, params["requestId"]))
        if entry is not None:
            logger.info("client=%s cancelled request %.64r", ctx.principal.name, params["requestId"])
            entry.stop(RequestCancelled("the request was cancelled by the client"))


def _elicitation_verdict(response: Response) -> tuple[bool, str | None]:
    """(approve?, reason) from a client's answer to the approval elicitation: only accept + yes approves."""
    if response.error is not None:
        return False, "the client answered the question with an error"
    result = response.result if isinstance(response.result, dict) else {}
    action = result.get("action")
    content = result.get("content")
    if action == "accept" and isinstance(content, dict) and content.get(ELICIT_FIELD) is True:
        return True, None
    if action in ("decline", "cancel"):
        return False, f"the client's user chose {action}"
    return False, "the client's user did not say yes"


def _raise_unless_approved(approval: approvals.Approval) -> None:
    data = {"approval_id": approval.id, "reason": approval.reason, "decided_by": approval.decided_by}
    if approval.state is approvals.State.APPROVED:
        return
    if approval.state is approvals.State.DENIED:
        raise ConfirmationDenied(f"{approval.method}: the confirmation was denied", data)
    if approval.state is approvals.State.EXPIRED:
        raise ConfirmationExpired(f"{approval.method}: nobody confirmed the call in time", data)
    raise RequestCancelled(f"{approval.method}: the approval was withdrawn ({approval.reason})", data)


CONFIRM_NOTE = "[Needs a person's confirmation before it runs.] "
CONFIRM_META = "io.gatewayd/requiresConfirmation"


def _mark_confirm(described: dict[str, Any]) -> None:
    """Say in the listing that a tool waits for a person, for the model (description) and programs (_meta)."""
    described["description"] = CONFIRM_NOTE + str(described.get("description") or "")
    meta = described.get("_meta")
    described["_meta"] = {**(meta if isinstance(meta, dict) else {}), CONFIRM_META: True}


def _meta_of(params: Any) -> Any:
    return params.get("_meta") if isinstance(params, dict) else None


def _arguments(params: Any) -> Any:
    """The arguments of a direct call as rules see them: named params without the protocol's `_meta`."""
    if isinstance(params, dict) and "_meta" in params:
        return {key: value for key, value in params.items() if key != "_meta"}
    return params


def _request_key(ctx: CallContext, request_id: Any) -> tuple[str, str, str]:
    """A request by its id as this client sent it in this session (calls in flight, elicitations answered)."""
    session = ctx.session.id if ctx.session else ""
    # repr tells the id 1 from the id "1", as the client meant them, without an encoder per call.
    return (ctx.principal.name, session, repr(request_id))


def _event_mapper(ctx: CallContext, meta: Any) -> tuple[Emit | None, bool]:
    """A sink that turns a child's notifications into the caller's, and whether progress was asked for."""
    emit = ctx.emit
    if emit is None:
        return None, False
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    session = ctx.session

    def forward(message: dict[str, Any]) -> None:
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

    return forward, token is not None


# A plain JSON-RPC result's text for the model.
_RESULT_TEXT = jsontext.encoder(separators=(", ", ": "))


def _as_tool_result(result: Any) -> dict[str, Any]:
    """A plain JSON-RPC result as an MCP CallToolResult: text for the model, structure for programs."""
    structured = result if isinstance(result, dict) else {"result": result}
    return {"content": [{"type": "text", "text": _RESULT_TEXT(result)}],
            "structuredContent": structured, "isError": False}


def _set_level(ctx: CallContext, params: Any) -> dict[str, Any]:
    level = params.get("level") if isinstance(params, dict) else None
    if level not in LOG_LEVELS:
        raise InvalidParams(f"logging/setLevel: level must be one of {', '.join(LOG_LEVELS)}")
    if ctx.session is not None:
        ctx.session.log_level = level
    return {}
