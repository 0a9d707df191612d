"""Upstream dialects: how the gateway speaks to one kind of tool server, picked in one place.

Owns each upstream protocol's side of the boundary: the start-up handshake, what the server offers
(asked of the child, or declared in its tools.d file), calling a tool (answered as an MCP
CallToolResult), calling a method directly (the child's own result), sending a notification, and
answering the requests a child sends unasked. `dialect_for` is the only place that reads a server's
`protocol`. Does not own the child's lifecycle, admission or restarts (server.py) or the pipes
(connection.py).
"""

from __future__ import annotations

import abc
import logging
from typing import Any, ClassVar

from gatewayd import __version__, jsontext
from gatewayd.config.models import ServerConfig
from gatewayd.errors import ToolServerUnavailable, UpstreamError
from gatewayd.upstream.api import EventSink, ToolDef
from gatewayd.upstream.connection import Connection
from gatewayd.upstream.peer import default_reply

logger = logging.getLogger(__name__)

# The MCP version the gateway offers its tool servers; it accepts whatever they answer.
UPSTREAM_PROTOCOL_VERSION = "2025-11-25"
# A `tools/list` that pages forever is cut off here.
MAX_TOOL_PAGES = 100
# A plain JSON-RPC result's text for the model.
_RESULT_TEXT = jsontext.encoder(separators=(", ", ": "))


class Dialect(abc.ABC):
    """One upstream protocol, spoken to the child of one server (`tag` names it in logs)."""

    # The protocol's name in tools.d and in `gatewayctl status`.
    protocol: ClassVar[str]

    def __init__(self, name: str, config: ServerConfig) -> None:
        self.name = name
        self.config = config

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
    async def call_tool(
        self, conn: Connection, tool: str, arguments: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        """An MCP `tools/call` of `tool`, answered as a CallToolResult."""

    @abc.abstractmethod
    async def call_method(
        self, conn: Connection, method: str, params: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        """A direct call of `method`, answered with the child's own result."""

    @abc.abstractmethod
    def can_notify(self, method: str) -> bool:
        """Whether `method` may be sent as a notification (nothing comes back)."""

    def on_request(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a request the child sends unasked (its own id kept). Both dialects answer `ping` and
        refuse the rest for now (nothing is relayed to the caller yet), so the child never waits."""
        return default_reply(message)


class McpDialect(Dialect):
    """An MCP server over stdio: `initialize`, `tools/list` (paged), every call a `tools/call`."""

    protocol = "mcp"

    @property
    def declared(self) -> list[ToolDef] | None:
        return None

    async def handshake(self, conn: Connection, tag: str) -> list[ToolDef] | None:
        timeout = self.config.startup_timeout
        try:
            result = await conn.call(
                "initialize",
                {
                    "protocolVersion": UPSTREAM_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "gatewayd", "version": __version__},
                },
                timeout=timeout,
            )
            await conn.notify("notifications/initialized")
            tools = await self.list_tools(conn, tag)
        except UpstreamError as exc:
            raise ToolServerUnavailable(
                f"tool server {self.name!r} refused the MCP handshake: {exc.message}", {"server": self.name}
            ) from exc
        version = result.get("protocolVersion") if isinstance(result, dict) else "?"
        logger.info("server=%s pid=%d ready: protocol %s, %d tools", tag, conn.pid, version,
                    len({tool.method for tool in tools}))
        return tools

    async def list_tools(self, conn: Connection, tag: str) -> list[ToolDef]:
        tools: list[ToolDef] = []
        cursor: Any = None
        for _ in range(MAX_TOOL_PAGES):
            params = {"cursor": cursor} if cursor is not None else {}
            try:
                page = await conn.call("tools/list", params, timeout=self.config.startup_timeout)
            except UpstreamError as exc:
                # A server without the tools capability has nothing to list; that is not a failure.
                logger.info("server=%s tools/list refused: %s", tag, exc.message)
                break
            if not isinstance(page, dict):
                break
            tools.extend(_tool_def(item) for item in page.get("tools", []) if _valid_tool(item))
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return tools

    async def call_tool(
        self, conn: Connection, tool: str, arguments: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        call_id = conn.new_id()
        params: dict[str, Any] = {"name": tool, "arguments": arguments if arguments is not None else {}}
        if progress:
            # The gateway's own id is the token: unique per child, whatever the clients chose.
            params["_meta"] = {"progressToken": call_id}
        return await conn.call(
            "tools/call", params, timeout=timeout, on_event=on_event, request_id=call_id, cancel_on_timeout=True
        )

    async def call_method(
        self, conn: Connection, method: str, params: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        # A direct `server.tool` call of an MCP server is its tool call.
        return await self.call_tool(conn, method, params, timeout, on_event, progress)

    def can_notify(self, method: str) -> bool:
        return False


class JsonRpcDialect(Dialect):
    """A plain JSON-RPC 2.0 server over stdio: no handshake, its methods declared in its tools.d file."""

    protocol = "jsonrpc"

    def __init__(self, name: str, config: ServerConfig) -> None:
        super().__init__(name, config)
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

    async def call_tool(
        self, conn: Connection, tool: str, arguments: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        try:
            result = await self.call_method(conn, tool, arguments, timeout, on_event, progress)
        except UpstreamError as exc:
            # The tool's own failure is a result the model can read, not a protocol error.
            return {"content": [{"type": "text", "text": exc.message}], "isError": True,
                    "structuredContent": {"error": exc.error}}
        return _as_tool_result(result)

    async def call_method(
        self, conn: Connection, method: str, params: Any, timeout: float, on_event: EventSink | None, progress: bool
    ) -> Any:
        if self.config.methods[method].notification:
            await conn.notify(method, params)
            return None
        call_id = conn.new_id()
        if progress and isinstance(params, dict) and "_meta" not in params:
            # Progress is routed by token: the gateway's own id, as for MCP. Arguments that have a `_meta` of their
            # own were decided with it and go as they are (then without progress).
            params = {**params, "_meta": {"progressToken": call_id}}
        return await conn.call(method, params, timeout=timeout, on_event=on_event, request_id=call_id)

    def can_notify(self, method: str) -> bool:
        return True


DIALECTS: dict[str, type[Dialect]] = {dialect.protocol: dialect for dialect in (McpDialect, JsonRpcDialect)}


def dialect_for(name: str, config: ServerConfig) -> Dialect:
    """The dialect a server's tools.d file asks for: the one place `protocol` is read."""
    return DIALECTS[config.protocol](name, config)


def _valid_tool(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str) and bool(item["name"])


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
