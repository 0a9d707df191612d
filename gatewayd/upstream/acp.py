"""The Agent Client Protocol (ACP) over stdio: a long-running agent as a tool server (`protocol = "acp"`).

Owns the gateway's side of an ACP agent's wire: the `initialize` handshake (declaring the client
capabilities the gateway serves: reading and writing text files; terminals if offered), the session methods a
client may call directly (`SERVER.session/new`, `session/load`, `session/resume`, `session/prompt`,
`session/set_mode`, `session/set_config_option`, `session/cancel`, `session/close`, `session/delete`,
`session/list`), and the MCP tool `prompt` that drives an agent from any MCP client (a new session,
or the one named, then one turn; the agent's words are the result, its updates the call's progress and
log lines). Also:

  - which client each of the agent's sessions belongs to: a session id the agent hands out is bound to
    the client that received it, and any other client naming it is told it does not exist (nor is it in the
    `session/list` that client is answered);
  - a turn (`session/prompt`) at a time per session, its deadline following its activity: each update
    starts the tools.d `activity_timeout` again, under the method's `timeout` as a hard cap, and a
    wait for a person does not count as silence; a turn that ends by timeout or cancel is told
    `session/cancel`;
  - `session/update` notifications routed, in order, to the caller of the turn of that session (as they
    are for a direct call, as progress and log lines for the tool), at most MAX_TURN_UPDATES a turn; one sent
    between the session's turns (the commands a new session offers, a title, a background job's news) held for its
    next turn, at most MAX_HELD_UPDATES held across the agent's sessions, and told as it comes, as a log line, to the
    MCP session of the last turn's caller while it lasts (`AgentHost.tell`);
  - the agent's requests during a turn (`session/request_permission`, `fs/read_text_file`,
    `fs/write_text_file`, and `terminal/*` when tools.d `terminals = true`) answered by the turn's
    `Delivery.host` (agents.py: policy, the confirmation gate, audit); between a session's turns (an agent
    going on with a background job) what needs no new decision about a terminal the session keeps (its output,
    waiting for its exit, killing or releasing it) is answered from the session's terminals, and the rest is
    decided for the client the session belongs to, as its last turn's caller (`AgentHost.between_turns`: a person
    confirms on gatewayctl, the web page, or the caller's MCP session while it lasts) — a new terminal only where
    terminals are the session's (made between turns, it has no turn to end with); at most MAX_BETWEEN_ASKS such
    requests wait at once. A request naming a session the asking child does not hold, or with nothing to answer it,
    is refused at once: the agent never waits for nobody;
  - how long its terminals live: the turn's end ends them, or (tools.d `terminal_lifetime = "session"`) they
    are the session's, kept across its turns until the agent releases them, the session is forgotten
    (MAX_SESSIONS) or the agent's child ends (`ended`); such an agent is not stopped idle while one of them
    runs (`keeps_child`).

Does not own deciding or answering those requests (agents.py), the child's lifecycle (server.py) or
per-client children (fleet.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gatewayd import __version__
from gatewayd.config.models import ServerConfig
from gatewayd.errors import CallTimedOut, GatewayError, ToolServerUnavailable, UpstreamError, error_response
from gatewayd.jsonrpc import result_response
from gatewayd.terminals import Terminals
from gatewayd.upstream.api import AgentHost, Caller, Delivery, ToolDef
from gatewayd.upstream.connection import Connection
from gatewayd.upstream.dialects import Dialect
from gatewayd.upstream.eras import Eras

logger = logging.getLogger(__name__)

ACP_PROTOCOL_VERSION = 1
# What the gateway serves the agent as its client: text files, read and written under the caller's policy, and
# terminals when the tools.d file offers them.
FILES = {"readTextFile": True, "writeTextFile": True}
# The session methods a client may call directly; `session/cancel` is a notification in ACP.
PROMPT, NEW, LOAD, SET_MODE, CANCEL = "session/prompt", "session/new", "session/load", "session/set_mode", \
    "session/cancel"
LIST, RESUME, CLOSE, DELETE, SET_CONFIG = "session/list", "session/resume", "session/close", "session/delete", \
    "session/set_config_option"
SESSION_METHODS = frozenset({PROMPT, NEW, LOAD, SET_MODE, CANCEL, LIST, RESUME, CLOSE, DELETE, SET_CONFIG})
# The MCP tool that runs one turn, and its arguments.
PROMPT_TOOL = "prompt"
PROMPT_SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "What to tell the agent."},
        "sessionId": {"type": "string", "description": "The agent session to continue (from an earlier result); "
                                                       "a new one when left out."},
    },
    "required": ["text"],
}
# What the agent asks its client that the gateway answers (agents.py); `terminal/*` only when offered.
HOSTED = frozenset({"session/request_permission", "fs/read_text_file", "fs/write_text_file"})
TERMINAL = frozenset({"terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill",
                      "terminal/release"})
# What an agent may ask of a terminal its session keeps between turns: nothing here runs a new command.
KEPT_TERMINAL = TERMINAL - {"terminal/create"}
UPDATE = "session/update"
# A turn's updates passed on to its caller: an agent that floods is cut off there (its result still arrives).
MAX_TURN_UPDATES = 10_000
# Updates an agent sends between its sessions' turns kept for their next turns, across its sessions.
MAX_HELD_UPDATES = 64
# The agent's words a `prompt` tool result carries; the rest is cut, and the result says so.
MAX_TURN_TEXT = 1024 * 1024
# Sessions of one agent whose owner the gateway remembers; an agent that hands out more has the oldest forgotten.
MAX_SESSIONS = 4096
# A session id longer than this is not one this gateway handed on.
MAX_SESSION_ID = 256
# Requests of an agent's sessions between their turns being answered at once (a permission waits for a person);
# past it the next is refused: a job that asks faster than anyone answers holds no more of the daemon than this.
MAX_BETWEEN_ASKS = 64
# What a direct caller (and rpc.discover) is told of each session method; its params are the agent's own (ACP).
SESSION_DESCRIPTIONS = {
    NEW: "Open an agent session: {cwd, mcpServers}; answers {sessionId}, bound to this client.",
    LOAD: "Load an earlier session of this client: {sessionId, cwd, mcpServers}; its history streams as updates.",
    PROMPT: "One turn: {sessionId, prompt: [content blocks]}; its session/update notifications stream on an SSE "
            "answer, then {stopReason}.",
    SET_MODE: "Set a session's mode: {sessionId, modeId}.",
    SET_CONFIG: "Set one of a session's configuration options: {sessionId, configId, value}.",
    CANCEL: "Stop the session's running turn: {sessionId} (a notification in ACP; answered with null here).",
    LIST: "The sessions of this client the agent knows: {cwd?, cursor?}; answers {sessions, nextCursor?}.",
    RESUME: "Take up an earlier session of this client without its history: {sessionId, cwd, mcpServers}.",
    CLOSE: "End a session's work and free what it holds (its terminals too): {sessionId}.",
    DELETE: "Remove a session of this client from the agent's list: {sessionId}.",
}


def _unknown_session(session: Any) -> UpstreamError:
    return UpstreamError({"code": -32602, "message": f"unknown session {str(session)[:MAX_SESSION_ID]!r}"})


@dataclass(eq=False)
class _Turn:
    """One `session/prompt` in flight: its gateway id on the child, how it is delivered, and what it gathered."""

    call_id: int
    conn: Connection
    how: Delivery
    # Through the MCP `prompt` tool (updates become progress and log lines; the agent's words the result).
    tool: bool
    words: list[str] = field(default_factory=list)
    size: int = 0
    updates: int = 0
    # The agent's requests being answered for this turn; ended with it.
    asks: set[asyncio.Task[None]] = field(default_factory=set)
    # Where its `terminal/*` run (None: none offered): the turn's own set, or its session's.
    terminals: Terminals | None = None


class AcpDialect(Dialect):
    """An ACP agent over stdio: `initialize`, sessions bound to clients, turns with activity deadlines."""

    protocol = "acp"

    def __init__(self, name: str, config: ServerConfig, owner: Caller | None = None, eras: Eras | None = None,
                 era_key: str = "") -> None:
        super().__init__(name, config, owner, eras, era_key)
        self._tools = [ToolDef(PROMPT_TOOL, f"Tell the {name} agent something and get its answer: one turn of a "
                               "conversation that goes on with the sessionId the result gives.", PROMPT_SCHEMA)]
        # The client each session the agent handed out belongs to, oldest first.
        self._owners: dict[str, str] = {}
        self._turns: dict[str, _Turn] = {}
        self._hosted = HOSTED | TERMINAL if config.terminals else HOSTED
        # With terminal_lifetime "session": each session's terminals, kept between its turns while it has any, with
        # the child they belong to (a session is one child's: they end with it).
        self._kept: dict[str, tuple[Connection, Terminals]] = {}
        # Kept terminals of sessions forgotten while the agent runs, being killed (awaited by `ended`).
        self._closing: set[asyncio.Task[None]] = set()
        # Who answers each session's requests between its turns (its client, with no caller: agents.py), with the
        # child that holds the session.
        self._hosts: dict[str, tuple[Connection, AgentHost]] = {}
        # The agent's requests between its sessions' turns, being answered, with the child that asked and the session
        # (ended by `ended`, and by the session's close, delete or forgetting).
        self._between_asks: dict[asyncio.Task[None], tuple[Connection, str]] = {}
        # Updates of its sessions sent between their turns, oldest first, for each session's next turn.
        # With each, the MCP session that was told it as it came (`_hold`), if one was.
        self._between: collections.deque[tuple[str, dict[str, Any], str | None]] = \
            collections.deque(maxlen=MAX_HELD_UPDATES)

    @property
    def declared(self) -> list[ToolDef] | None:
        return self._tools

    def declares(self, method: str) -> bool | None:
        return method == PROMPT_TOOL or method in SESSION_METHODS

    def settings_name(self, method: str) -> str:
        return PROMPT if method == PROMPT_TOOL else method

    async def handshake(self, conn: Connection, tag: str) -> list[ToolDef] | None:
        try:
            result = await conn.call("initialize", {
                "protocolVersion": ACP_PROTOCOL_VERSION,
                "clientCapabilities": {"fs": FILES, "terminal": self.config.terminals},
                "clientInfo": {"name": "gatewayd", "version": __version__},
            }, timeout=self.config.startup_timeout)
        except UpstreamError as exc:
            raise ToolServerUnavailable(f"agent {self.name!r} refused the ACP handshake: {exc.message}",
                                        {"server": self.name}) from exc
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        logger.info("server=%s pid=%d ready: ACP protocol %s", tag, conn.pid, version)
        return self._tools

    async def list_tools(self, conn: Connection, tag: str) -> list[ToolDef]:
        return self._tools

    def can_notify(self, method: str) -> bool:
        return method == CANCEL

    async def notify(self, conn: Connection, method: str, params: Any, how: Delivery) -> None:
        self._own(params, how)
        await conn.notify(method, params)

    # -- calls -----------------------------------------------------------------------------

    async def call_method(self, conn: Connection, method: str, params: Any, timeout: float, how: Delivery) -> Any:
        if method == PROMPT_TOOL:
            # A direct call of the tool answers what `tools/call` does: its CallToolResult.
            return await self.call_tool(conn, method, params, timeout, how)
        if method not in SESSION_METHODS:
            raise UpstreamError({"code": -32601, "message": f"an ACP agent has no method {method}"})
        if not isinstance(params, dict):
            raise UpstreamError({"code": -32602, "message": f"{method} needs params, an object"})
        if method == NEW:
            result = await conn.call(method, params, timeout=timeout)
            self._bind(result.get("sessionId") if isinstance(result, dict) else None, how, conn)
            return result
        if method in (LOAD, RESUME):
            session = params.get("sessionId")
            if self._owners.get(str(session), how.client) != how.client:
                raise _unknown_session(session)
            if method == LOAD:
                # Loading replays the conversation as updates, which reach the caller as a turn's do.
                result, _ = await self._turn(conn, method, params, timeout, how, tool=False)
            else:
                result = await conn.call(method, params, timeout=timeout)
            self._bind(session, how, conn)
            return result
        if method == LIST:
            return self._listed(await conn.call(method, params, timeout=timeout), how.client)
        session = self._own(params, how)
        if method == CANCEL:
            await conn.notify(method, params)
            return None
        if method == PROMPT:
            result, _ = await self._turn(conn, method, params, timeout, how, tool=False)
            return result
        result = await conn.call(method, params, timeout=timeout)
        if method in (CLOSE, DELETE):
            # What the session held is freed with it; a deleted one is no one's any more.
            self._let_go(session)
            if method == DELETE:
                self._owners.pop(session, None)
        return result

    def _listed(self, result: Any, client: str) -> Any:
        """The agent's `session/list` answer with only the caller's own sessions: another client's, and any the
        gateway never handed out (the agent's from before), are not there, as they do not exist for it."""
        sessions = result.get("sessions") if isinstance(result, dict) else None
        if not isinstance(sessions, list):
            return result
        mine = [entry for entry in sessions
                if isinstance(entry, dict) and self._owners.get(str(entry.get("sessionId"))) == client]
        return {**result, "sessions": mine}

    async def call_tool(self, conn: Connection, tool: str, arguments: Any, timeout: float, how: Delivery) -> Any:
        if tool != PROMPT_TOOL:
            return await self.call_method(conn, tool, arguments, timeout, how)
        text = arguments.get("text") if isinstance(arguments, dict) else None
        if not isinstance(text, str):
            return _tool_error("prompt needs the argument text, a string")
        try:
            session = arguments.get("sessionId")
            if session is None:
                created = await conn.call(NEW, {"cwd": self._cwd(conn), "mcpServers": []},
                                          timeout=self.config.timeout_for(NEW))
                session = created.get("sessionId") if isinstance(created, dict) else None
                self._bind(session, how, conn)
            self._own({"sessionId": session}, how)
            result, turn = await self._turn(conn, PROMPT, {"sessionId": session,
                                                           "prompt": [{"type": "text", "text": text}]},
                                            timeout, how, tool=True)
        except UpstreamError as exc:
            # The agent's own failure is a result the model can read, not a protocol error.
            return _tool_error(exc.message)
        words = "".join(turn.words)
        if turn.size > MAX_TURN_TEXT:
            words += f"\n[… {turn.size - MAX_TURN_TEXT} more characters of the agent's answer were cut]"
        stop = result.get("stopReason") if isinstance(result, dict) else None
        return {"content": [{"type": "text", "text": words}], "isError": False,
                "structuredContent": {"sessionId": session, "stopReason": stop}}

    async def _turn(self, conn: Connection, method: str, params: dict[str, Any], timeout: float, how: Delivery,
                    *, tool: bool) -> tuple[Any, _Turn]:
        """One turn (or a load) of a session: its updates and requests go to this caller until it ends; its
        result, and what the turn gathered."""
        session = str(params.get("sessionId"))
        if session in self._turns:
            raise UpstreamError({"code": -32602, "message": f"session {session[:MAX_SESSION_ID]!r} is already "
                                                            "running a turn: wait for it, or cancel it"})
        call_id = conn.new_id()
        turn = self._turns[session] = _Turn(call_id, conn, how, tool, terminals=self._terminals_for(session, conn))
        if how.host is not None and session in self._owners:
            # What the agent asks after this turn is put to this turn's caller while it can be asked. (A session being
            # loaded is no one's until the agent has loaded it: `_bind` then.)
            self._hosts[session] = conn, how.host.between_turns()
        caller = how.session.id if how.session is not None else None
        for held, told in self._held(session):
            # What the agent said of the session between turns comes first, as the caller would have heard it; a
            # `prompt` caller whose session heard it as it came is not told it again (its words are in the result).
            if tool and told is not None and told == caller:
                self._tool_update(turn, held, tell=False)
            else:
                self.on_notification(held)
        try:
            result = await conn.call(method, params, timeout=timeout, on_event=how.on_event, request_id=call_id,
                                     silence=self.config.silence_for(method), large=how.large)
            return result, turn
        except (CallTimedOut, asyncio.CancelledError):
            # ACP's own way to stop a turn; the agent then answers the prompt with stopReason "cancelled".
            with contextlib.suppress(ToolServerUnavailable):
                await asyncio.shield(conn.notify(CANCEL, {"sessionId": session}))
            raise
        finally:
            del self._turns[session]
            for ask in turn.asks:
                ask.cancel()
            await self._turn_ended(session, turn.terminals)

    def _terminals_for(self, session: str, conn: Connection) -> Terminals | None:
        """Where a turn of `session` on `conn` runs its terminals: nowhere when none are offered; else the turn's own
        set, or with terminal_lifetime "session" the session's."""
        if not self.config.terminals:
            return None
        if self.config.terminal_lifetime == "turn":
            return Terminals()
        kept = self._kept.get(session)
        if kept is None or kept[0] is not conn:
            kept = self._kept[session] = conn, Terminals()
        return kept[1]

    async def _turn_ended(self, session: str, terminals: Terminals | None) -> None:
        """A turn's own terminals are killed with it; a session's are kept while it has any."""
        if terminals is None:
            return
        kept = self._kept.get(session)
        if kept is not None and kept[1] is terminals:
            if not terminals:
                del self._kept[session]
            return
        await asyncio.shield(terminals.close())

    # -- what the agent sends unasked ------------------------------------------------------

    def on_notification(self, message: dict[str, Any]) -> bool:
        if message.get("method") != UPDATE:
            return False
        params = message.get("params")
        session = str(params.get("sessionId")) if isinstance(params, dict) else ""
        turn = self._turns.get(session)
        if turn is None:
            self._hold(session, message)
            return True
        turn.conn.touch(turn.call_id)
        turn.updates += 1
        if turn.updates > MAX_TURN_UPDATES:
            if turn.updates == MAX_TURN_UPDATES + 1:
                logger.warning("server=%s sent more than %d updates in one turn: the rest are dropped", self.name,
                               MAX_TURN_UPDATES)
            return True
        if turn.tool:
            self._tool_update(turn, message)
        elif turn.how.on_event is not None:
            turn.how.on_event(message)
        return True

    def _hold(self, session: str, message: dict[str, Any]) -> None:
        """An update between turns (the commands a new session offers, a title made after a turn, a background job's
        news): kept for the session's next turn, if the session is someone's, past MAX_HELD_UPDATES the oldest
        dropped; and told at once, as a log line, to the MCP session of its last turn's caller while it lasts."""
        if session not in self._owners:
            logger.debug("server=%s update of no session a client holds dropped", self.name)
            return
        update = message["params"].get("update")
        kind = update.get("sessionUpdate") if isinstance(update, dict) else None
        logger.info("server=%s session %.16s… %.64s between turns: held for its next turn", self.name, session,
                    kind)
        between = self._hosts.get(session)
        # Told as it comes too, to whoever can hear it now: the user of the session's last turn's caller.
        told = between[1].tell(self._log_line(update)) if between is not None else None
        self._between.append((session, message, told))

    def _held(self, session: str) -> list[tuple[dict[str, Any], str | None]]:
        """The updates held for `session`, taken, each with the MCP session told it as it came (or None)."""
        held = [(message, told) for owner, message, told in self._between if owner == session]
        if held:
            self._between = collections.deque((entry for entry in self._between if entry[0] != session),
                                              maxlen=MAX_HELD_UPDATES)
        return held

    def _tool_update(self, turn: _Turn, message: dict[str, Any], tell: bool = True) -> None:
        """An update of a turn run by the `prompt` tool: its words kept for the result, and the caller told (unless
        not `tell`)."""
        update = message["params"].get("update")
        kind = update.get("sessionUpdate") if isinstance(update, dict) else None
        content = update.get("content") if isinstance(update, dict) else None
        if kind == "agent_message_chunk" and isinstance(content, dict) and isinstance(content.get("text"), str):
            text = content["text"]
            if turn.size < MAX_TURN_TEXT:
                turn.words.append(text[:MAX_TURN_TEXT - turn.size])
            turn.size += len(text)
        sink = turn.how.on_event
        if sink is None or not tell:
            return
        if turn.how.progress:
            sink({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": turn.call_id, "progress": turn.updates, "message": str(kind)}})
        sink(self._log_line(update))

    def _log_line(self, update: Any) -> dict[str, Any]:
        """An update as an MCP caller hears it: a log line at `info` from the agent's server."""
        return {"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "logger": self.name, "data": update}}

    def on_request(self, message: dict[str, Any], conn: Connection | None = None) -> dict[str, Any] | None:
        method = str(message.get("method"))
        params = message.get("params")
        session = str(params.get("sessionId")) if isinstance(params, dict) else ""
        turn = self._turns.get(session)
        why: str | None = None
        if method not in self._hosted:
            why = "is not offered"
        elif conn is None or (turn is not None and turn.how.host is None):
            why = "belongs to no turn a client is waiting for"
        elif turn is None:
            why = self._between_turns(conn, session, method, message)
        else:
            ask = asyncio.get_running_loop().create_task(self._ask(turn, turn.how.host, message),
                                                         name=f"{self.name}-{method}")
            turn.asks.add(ask)
            ask.add_done_callback(turn.asks.discard)
        if why is None:
            return None
        logger.info("server=%s %s refused: it %s", self.name, method, why)
        return {"jsonrpc": "2.0", "id": message.get("id"),
                "error": {"code": -32601, "message": f"{method}: refused, it {why}"}}

    def _between_turns(self, conn: Connection, session: str, method: str, message: dict[str, Any]) -> str | None:
        """Start answering a request of `session` between its turns (None), or say why it is refused. A kept
        terminal's output, exit, kill or release is the session's terminals' to answer: its command was decided
        when it was made. Anything else is decided for the session's client, as its turn's caller's would be."""
        kept = self._kept.get(session)
        between = self._hosts.get(session)
        # The child that holds what answers the request: the session's terminals, or the session itself.
        held_by = (kept if method in KEPT_TERMINAL else between) or (None, None)
        if held_by[0] is not conn:
            return "belongs to no turn a client is waiting for"
        if len(self._between_asks) >= MAX_BETWEEN_ASKS:
            return f"came between turns while {MAX_BETWEEN_ASKS} requests of this agent's sessions wait already"
        if method == "terminal/create" and self.config.terminal_lifetime != "session":
            return 'came between turns, and a terminal here ends with the turn that made it (tools.d ' \
                   'terminal_lifetime = "session" keeps terminals for the session)'
        made_in = None
        if method in KEPT_TERMINAL:
            assert kept is not None
            answer = partial(_kept_terminal, kept[1], message)
            whose = ""
        else:
            assert between is not None
            made_in = self._terminals_for(session, conn) if method == "terminal/create" else None
            answer = partial(between[1].answer, self.name, message, made_in)
            whose = f": decided for client={self._owners.get(session)}"
        logger.info("server=%s session %.16s… %s between turns%s", self.name, session, method, whose)
        ask = asyncio.get_running_loop().create_task(self._reply_between(conn, session, message, answer, made_in),
                                                     name=f"{self.name}-{method}")
        self._between_asks[ask] = conn, session
        ask.add_done_callback(self._between_asks.pop)
        return None

    async def _reply_between(self, conn: Connection, session: str, message: dict[str, Any],
                             answer: Callable[[], Awaitable[dict[str, Any]]], made_in: Terminals | None) -> None:
        """Reply to the agent's request of `session` between its turns with what `answer` gives. Let go with the session
        (the agent is then told so) or the child. `made_in`: the session's terminals, made for a `terminal/create`,
        dropped again if no terminal came of it."""
        try:
            reply = await answer()
        except asyncio.CancelledError:
            reply = {"jsonrpc": "2.0", "id": message.get("id"),
                     "error": {"code": -32000, "message": f"{message.get('method')}: the session ended"}}
        finally:
            kept = self._kept.get(session)
            if made_in is not None and kept is not None and kept[1] is made_in and not made_in \
                    and session not in self._turns:
                del self._kept[session]
        conn.reply(reply)

    async def _ask(self, turn: _Turn, host: Any, message: dict[str, Any]) -> None:
        """Answer one of the agent's requests through the host; while it waits (a person, say), the turn is not
        silent. Ended with the turn: the agent is then told so."""
        turn.conn.hold(turn.call_id, True)
        try:
            reply = await host.answer(self.name, message, turn.terminals)
        except asyncio.CancelledError:
            reply = {"jsonrpc": "2.0", "id": message.get("id"),
                     "error": {"code": -32000, "message": f"{message.get('method')}: the turn ended"}}
        finally:
            turn.conn.hold(turn.call_id, False)
        turn.conn.reply(reply)

    # -- sessions and their owners ---------------------------------------------------------

    def _bind(self, session: Any, how: Delivery, conn: Connection) -> None:
        """The agent on `conn` handed `session` to the client `how` is for: only that client may name it from now
        on, and what the agent asks of it between turns is decided for that client."""
        if not isinstance(session, str) or len(session) > MAX_SESSION_ID:
            raise UpstreamError({"code": -32603, "message": "the agent answered without a usable sessionId"})
        self._owners.pop(session, None)
        self._owners[session] = how.client
        if how.host is not None:
            self._hosts[session] = conn, how.host.between_turns()
        while len(self._owners) > MAX_SESSIONS:
            forgotten = next(iter(self._owners))
            del self._owners[forgotten]
            self._let_go(forgotten)

    def _let_go(self, session: str) -> None:
        """A session forgotten (no one can reach it now), closed or deleted: what it asks between turns is no one's
        to answer any more, and its kept terminals are killed."""
        self._hosts.pop(session, None)
        for ask in [ask for ask, (_, asker) in self._between_asks.items() if asker == session]:
            ask.cancel()
        kept = self._kept.pop(session, None)
        if kept is None or session in self._turns:
            # A running turn's set is closed when the turn ends (it is no longer the session's).
            return
        terminals = kept[1]
        terminals.kill()
        closing = asyncio.get_running_loop().create_task(terminals.close(), name=f"{self.name}-terminals")
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    # -- the child's life ------------------------------------------------------------------

    def keeps_child(self) -> str | None:
        running = sum(terminals.running() for _, terminals in self._kept.values())
        asks = len(self._between_asks)
        why = [f"{running} terminal(s) its sessions keep still run"] if running else []
        if asks:
            why.append(f"{asks} request(s) of its sessions between turns are being answered")
        return "; ".join(why) or None

    async def ended(self, conn: Connection) -> None:
        """The agent's child on `conn` ended: the terminals its sessions kept are killed (no one can release them
        now). A child started since keeps its own."""
        ended = [session for session, (owner, _) in self._kept.items() if owner is conn]
        kept = [self._kept.pop(session)[1] for session in ended]
        for terminals in kept:
            terminals.kill()
        for session in [session for session, (owner, _) in self._hosts.items() if owner is conn]:
            del self._hosts[session]
        asks = [ask for ask, (asker, _) in self._between_asks.items() if asker is conn]
        for ask in asks:
            ask.cancel()  # nobody to answer
        await asyncio.gather(*(terminals.close() for terminals in kept), *self._closing, *asks, return_exceptions=True)

    def _own(self, params: Any, how: Delivery) -> str:
        """The session a call names, if it is the caller's; another client's, or none, is unknown."""
        session = params.get("sessionId") if isinstance(params, dict) else None
        if not isinstance(session, str) or self._owners.get(session) != how.client:
            raise _unknown_session(session)
        return session

    def _cwd(self, conn: Connection) -> str:
        """Where a session the `prompt` tool opens works: the child's own working directory."""
        return os.path.abspath(conn.cwd) if conn.cwd else os.getcwd()


def direct_methods() -> list[ToolDef]:
    """The session methods a client may call directly, beside the `prompt` tool (rpc.discover lists them)."""
    return [ToolDef(method, text, {"type": "object"}) for method, text in SESSION_DESCRIPTIONS.items()]


async def _kept_terminal(terminals: Terminals, message: dict[str, Any]) -> dict[str, Any]:
    """The reply to a request about a terminal a session keeps: its command was decided when it was made."""
    params = message.get("params")
    assert isinstance(params, dict)
    try:
        return result_response(message.get("id"), await terminals.handle(str(message.get("method")), params))
    except GatewayError as exc:
        return error_response(message.get("id"), exc)


def _tool_error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}
