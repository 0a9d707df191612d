"""What goes on the wire: the echo call, its request bodies, the replies expected, and the MCP header names.

Owns the bytes every target sends and the checks every answer must pass, so the floor, gatewayd and
the child are driven with the same payload and judged by the same rule. Imports nothing heavy:
the floor process imports it too.
"""

from __future__ import annotations

import json
from typing import Any, Final

# The small params every call sends; `echo` returns them unchanged.
ECHO_PARAMS: Final[dict[str, Any]] = {"text": "hello", "n": 1}
# HTTP is request/response, so one id serves every HTTP call; the stdio target numbers its own.
HTTP_CALL_ID: Final = 1
SERVER_NAME: Final = "echo"
DIRECT_METHOD: Final = f"{SERVER_NAME}.echo"
TOOL_NAME: Final = f"{SERVER_NAME}__echo"
CHILD_METHOD: Final = "echo"

MCP_PROTOCOL_VERSION: Final = "2025-11-25"
SESSION_HEADER: Final = "Mcp-Session-Id"
VERSION_HEADER: Final = "MCP-Protocol-Version"
ACCEPT_JSON: Final = "application/json"
ACCEPT_SSE: Final = "application/json, text/event-stream"


def compact(message: Any) -> bytes:
    """Compact JSON, as gatewayd and the child write it."""
    return json.dumps(message, separators=(",", ":")).encode()


def request(method: str, params: Any, request_id: int | None = HTTP_CALL_ID) -> dict[str, Any]:
    """A JSON-RPC request (a notification when `request_id` is None)."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return message


DIRECT_BODY: Final = compact(request(DIRECT_METHOD, ECHO_PARAMS))
TOOL_CALL_BODY: Final = compact(request("tools/call", {"name": TOOL_NAME, "arguments": ECHO_PARAMS}))
INITIALIZE_BODY: Final = compact(request("initialize", {
    "protocolVersion": MCP_PROTOCOL_VERSION,
    "capabilities": {},
    "clientInfo": {"name": "gatewayd-bench", "version": "0"},
}, request_id=0))
INITIALIZED_BODY: Final = compact({"jsonrpc": "2.0", "method": "notifications/initialized"})
# MCP 2026-07-28: no session, every request carries its version and the client's capabilities in `_meta`, and its
# method and name in headers too.
MODERN_VERSION: Final = "2026-07-28"
MODERN_HEADERS: Final = {VERSION_HEADER: MODERN_VERSION, "Mcp-Method": "tools/call", "Mcp-Name": TOOL_NAME}
MODERN_META: Final = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "gatewayd-bench", "version": "0"}}
MODERN_TOOL_CALL_BODY: Final = compact(request("tools/call", {
    "name": TOOL_NAME, "arguments": ECHO_PARAMS, "_meta": MODERN_META}))
# The floor's canned reply: exactly what gatewayd answers to DIRECT_BODY.
CANNED_REPLY: Final = compact({"jsonrpc": "2.0", "id": HTTP_CALL_ID, "result": ECHO_PARAMS})


class BadAnswer(Exception):
    """An answer that is not the echo of ECHO_PARAMS."""


def check_direct(message: Any, request_id: int = HTTP_CALL_ID) -> None:
    """A direct `echo` answer: the params back as the result, under the request's id."""
    if not isinstance(message, dict) or message.get("id") != request_id or message.get("result") != ECHO_PARAMS:
        raise BadAnswer(f"unexpected answer: {str(message)[:200]}")


def check_tool_result(message: Any) -> None:
    """A `tools/call` answer: a CallToolResult whose structuredContent is the params."""
    result = message.get("result") if isinstance(message, dict) and message.get("id") == HTTP_CALL_ID else None
    if not isinstance(result, dict) or result.get("isError") or result.get("structuredContent") != ECHO_PARAMS:
        raise BadAnswer(f"unexpected tool result: {str(message)[:200]}")


def response_of(body: bytes, content_type: str) -> Any:
    """The JSON-RPC response an MCP endpoint answered a POST with: one JSON body, or the response event of an SSE
    body (the server chooses either for a client that accepts both)."""
    return sse_response(body) if content_type == "text/event-stream" else json.loads(body)


def sse_response(body: bytes) -> Any:
    """The JSON-RPC response carried by an SSE body: the last `data:` event that has an id."""
    answer: Any = None
    for line in body.split(b"\n"):
        if line.startswith(b"data:"):
            message = json.loads(line[5:])
            if isinstance(message, dict) and "id" in message:
                answer = message
    if answer is None:
        raise BadAnswer(f"no response event in the SSE body: {body[:200]!r}")
    return answer
