"""What an ACP agent asks its client, answered by the gateway for the client the agent works for.

Owns the other direction of the pipeline for agents (upstream/acp.py hands each request here): the
agent's `session/request_permission`, `fs/read_text_file` and `fs/write_text_file` are calls of their
own, `SERVER.session/request_permission`, `SERVER.fs/read_text_file`, `SERVER.fs/write_text_file`,
made on behalf of the client whose turn it is — or, between its session's turns (an agent that goes on
with a background job after its turn ended), the client of the session's last turn (`between_turns`) —
decided by its policy (argument rules such as `path_under` on `path`, fail closed), confirmed by a person
where the policy says so, and audited like any call. Then:

  - a permission: denied (no grant) → the agent's reject option; granted with `confirm` → a person
    decides (the caller's user by elicitation, `gatewayctl`, the web page; between turns the last turn's
    caller's user while its MCP session lasts, and the operators), seeing the agent's own tool call and
    options: yes → its `allow_once` option, no → its `reject_once` option, nobody in time or the caller
    gone → `cancelled`, never an allow; granted outright → `allow_once`;
  - a file read or write: done by the gateway itself, bounded by MAX_FILE_BYTES, on an absolute path;
    denied → the agent gets the same error as for a method that does not exist;
  - a terminal (tools.d `terminals = true`): `SERVER.terminal/create` decided with its command, args, cwd
    and env as arguments (a person confirms it where the policy says), then run by terminals.py in the set
    the agent's dialect hands over (the turn's, or its session's: upstream/acp.py); its output, exit, kill and
    release need no new decision.

Does not own the ACP wire (upstream/acp.py), the policy (policy.py) or asking the person (confirmation.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from typing import Any

from gatewayd import audit
from gatewayd.authorize import authorize
from gatewayd.calls import Call, CallContext, Target
from gatewayd.confirmation import ConfirmationGate
from gatewayd.errors import (
    ConfirmationDenied,
    ConfirmationExpired,
    GatewayError,
    InvalidParams,
    MethodNotFound,
    RequestCancelled,
    error_response,
)
from gatewayd.jsonrpc import result_response
from gatewayd.records import Records
from gatewayd.sessions import Session
from gatewayd.terminals import Terminals
from gatewayd.upstream.api import Upstream

logger = logging.getLogger(__name__)

# How an agent's request reaches the gateway, as the audit log names it.
AGENT = "agent"
PERMISSION, READ, WRITE = "session/request_permission", "fs/read_text_file", "fs/write_text_file"
TERMINAL = "terminal/create"
# Largest text file an agent may read or write through the gateway.
MAX_FILE_BYTES = 4 * 1024 * 1024


class Agents:
    """Makes the host a turn's requests are answered by: the caller's call, the policy's records and gate."""

    def __init__(self, records: Records, gate: ConfirmationGate) -> None:
        self.records = records
        self.gate = gate

    def host(self, call: Call, server: Upstream) -> AgentHost:
        return AgentHost(self, call.ctx, server, call)


class AgentHost:
    """The answers to what an agent asks (upstream/api.AgentHost): during a turn, for the client whose call the turn
    is (`turn`); made by `between_turns`, between the session's turns, for the same client."""

    def __init__(self, agents: Agents, ctx: CallContext, server: Upstream, turn: Call | None = None,
                 caller: Session | None = None) -> None:
        self._agents = agents
        self._ctx = ctx
        self._server = server
        # The turn's own call (None: between turns, where nobody's call waits on what the agent asks).
        self._turn = turn
        # Between turns: the MCP session of the turn's caller, not kept alive by this host once the gateway let it go.
        self._caller = weakref.ref(caller) if caller is not None else None

    def between_turns(self) -> AgentHost:
        """The host of the session's requests once this turn is over: the same client, decided on the config current
        then, with no call waiting on them (`_context`). It keeps of the turn only who the client is and (weakly) the
        caller's MCP session, not the turn's call or its config generation."""
        ctx = self._ctx
        return AgentHost(self._agents, CallContext(ctx.principal, {}, authority=ctx.authority, operator=ctx.operator),
                         self._server, caller=ctx.session)

    def tell(self, message: dict[str, Any]) -> str | None:
        session = self._session()
        if session is None:
            return None
        session.hear(message)
        return session.id

    def _session(self) -> Session | None:
        """The turn's caller's MCP session while it lasts."""
        if self._turn is not None:
            return self._ctx.session
        session = self._caller() if self._caller is not None else None
        return session if session is not None and not session.ended else None

    def _trace(self) -> str:
        """The turn's trace id, made now if its records have not made it yet: what the agent asks during a turn is
        recorded as part of it. Between turns each request has its own ("")."""
        turn = self._turn
        if turn is None:
            return ""
        if not turn.trace:
            turn.trace = audit.trace_id(turn.meta)
        return turn.trace

    def _context(self) -> CallContext:
        """What a request is decided in: the turn's call's context; between turns, one with no call to answer or to
        end with, that still reaches the user of the turn's caller while its MCP session lasts: a question is put to
        them on its stream as well as to the operators (the session's end withdraws it, as a caller's going does in
        a turn), and only to the operators once it has ended."""
        ctx = self._ctx
        if self._turn is not None:
            return ctx
        session = self._session()
        return CallContext(ctx.principal, ctx.servers, session, emit=session.push if session is not None else None,
                           authority=ctx.authority, operator=ctx.operator)

    async def answer(self, server: str, message: dict[str, Any], terminals: Terminals | None) -> dict[str, Any]:
        method = str(message.get("method"))
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        assert isinstance(params, dict)
        # What policy rules see and a person is shown: the request without the session it names.
        arguments = {key: value for key, value in params.items() if key not in ("sessionId", "_meta")}
        call = Call(self._context(), AGENT, message.get("id"), f"{server}.{method}", params, arguments, None,
                    trace=self._trace())
        try:
            if method == PERMISSION:
                result = await self._permission(call, arguments)
            elif method.startswith("terminal/"):
                if terminals is None:
                    raise MethodNotFound(f"{method}: no terminals are offered")
                # A terminal made earlier had its command decided when it was made: no new decision.
                result = await (self._terminal(call, arguments, terminals) if method == TERMINAL
                                else terminals.handle(method, arguments))
            else:
                result = await self._file(call, method, arguments)
        except GatewayError as exc:
            return error_response(message.get("id"), exc)
        return result_response(message.get("id"), result)

    async def _permission(self, call: Call, arguments: dict[str, Any]) -> dict[str, Any]:
        options = arguments.get("options") if isinstance(arguments.get("options"), list) else []
        assert isinstance(options, list)
        records = self._agents.records
        try:
            confirm = await authorize(call, Target(self._server, PERMISSION, surface=True), records)
            if confirm is not None:
                await self._agents.gate.confirm(call, confirm)
        except (ConfirmationExpired, RequestCancelled) as exc:
            records.outcome(call, "cancelled", error_code=exc.code)
            return {"outcome": {"outcome": "cancelled"}}
        except (ConfirmationDenied, GatewayError) as exc:
            records.outcome(call, "rejected", error_code=exc.code)
            return _choose(options, "reject")
        records.outcome(call, "allowed")
        return _choose(options, "allow")

    async def _terminal(self, call: Call, arguments: dict[str, Any], terminals: Terminals) -> dict[str, Any]:
        """A command the agent wants run: decided (`SERVER.terminal/create`, its command, args, cwd and env), a
        person asked where the policy says, then started (terminals.py)."""
        records = self._agents.records
        confirm = await authorize(call, Target(self._server, TERMINAL, surface=True), records)
        try:
            if confirm is not None:
                await self._agents.gate.confirm(call, confirm)
            result = await terminals.create(arguments)
        except GatewayError as exc:
            records.outcome(call, exc.error_type, error_code=exc.code)
            raise
        records.outcome(call, "ok")
        return result

    async def _file(self, call: Call, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
        records = self._agents.records
        path = arguments.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise InvalidParams(f"{method} needs params.path, an absolute path")
        confirm = await authorize(call, Target(self._server, method, surface=True), records)
        try:
            if confirm is not None:
                await self._agents.gate.confirm(call, confirm)
            if method == READ:
                result: dict[str, Any] = {"content": await asyncio.to_thread(_read, path, arguments)}
            else:
                content = arguments.get("content")
                if not isinstance(content, str):
                    raise InvalidParams("fs/write_text_file needs params.content, a string")
                await asyncio.to_thread(_write, path, content)
                result = {}
        except GatewayError as exc:
            records.outcome(call, exc.error_type, error_code=exc.code)
            raise
        records.outcome(call, "ok")
        return result


def _choose(options: list[Any], kind: str) -> dict[str, Any]:
    """The agent's own option of `kind` ("allow" or "reject"), once-only first: never an "always" the person did
    not choose; `cancelled` when the agent offered none."""
    for wanted in (f"{kind}_once", f"{kind}_always" if kind == "reject" else None):
        for option in options:
            if isinstance(option, dict) and option.get("kind") == wanted and isinstance(option.get("optionId"), str):
                return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
    return {"outcome": {"outcome": "cancelled"}}


def _read(path: str, arguments: dict[str, Any]) -> str:
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise InvalidParams(f"{path}: {size} bytes, more than the {MAX_FILE_BYTES} an agent may read")
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read()
    except OSError as exc:
        raise InvalidParams(f"{path}: {exc.strerror}") from None
    line, limit = arguments.get("line"), arguments.get("limit")
    if isinstance(line, int) or isinstance(limit, int):
        lines = text.splitlines(keepends=True)
        start = max(0, line - 1) if isinstance(line, int) else 0
        end = start + limit if isinstance(limit, int) and limit >= 0 else None
        text = "".join(lines[start:end])
    return text


def _write(path: str, content: str) -> None:
    data = content.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise InvalidParams(f"{path}: {len(data)} bytes, more than the {MAX_FILE_BYTES} an agent may write")
    try:
        with open(path, "wb") as file:
            file.write(data)
    except OSError as exc:
        raise InvalidParams(f"{path}: {exc.strerror}") from None

