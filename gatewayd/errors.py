"""The error hierarchy and the only table that maps errors to the wire.

Every error a caller can see is a `GatewayError` subclass carrying its JSON-RPC code, an
`error_type` and whether retrying may help. `to_wire()` is the single place that turns one
into a JSON-RPC error object; `refusal()` is the single place that turns a refusal made below
the web layer (no token, too many sessions) into its HTTP answer, and the web layer turns
`HttpError` into a status code.
Errors a tool server returned itself travel as `UpstreamError`, verbatim; every error says whose it is
(`source`: the gateway's, or the tool server's own) and which code the caller got (`caller_code`), for the
audit log and the metrics.
"""

from __future__ import annotations

from typing import Any, ClassVar

# JSON-RPC 2.0 reserved codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# Gateway codes live in the implementation-defined range -32000..-32019.
TOOL_ERROR = -32010
# A failed MCP tool's text is its error's message up to this length; the whole result is in `data.result`.
TOOL_ERROR_MESSAGE_CHARS = 1000
TOOL_SERVER_UNAVAILABLE = -32011
CALL_TIMED_OUT = -32012
AUDIT_UNAVAILABLE = -32013
OVERLOADED = -32014
CONFIRMATION_DENIED = -32015
CONFIRMATION_EXPIRED = -32016
REQUEST_CANCELLED = -32017
CONFIRMATION_PENDING = -32018

# MCP's own codes of the 2026-07-28 era (-32020..-32099 are reserved for MCP).
HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022


class GatewayError(Exception):
    """Base of every error that reaches a caller as a JSON-RPC error."""

    code: ClassVar[int] = INTERNAL_ERROR
    error_type: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False
    # Standard JSON-RPC errors carry no gateway `data` unless given some.
    structured: ClassVar[bool] = True
    # Whose error it is: the gateway's own, or a tool server's (UpstreamError).
    source: ClassVar[str] = "gateway"

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}

    def to_wire(self) -> dict[str, Any]:
        """The JSON-RPC `error` member for this error."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.structured:
            error["data"] = {"error_type": self.error_type, "retryable": self.retryable, **self.data}
        elif self.data:
            error["data"] = self.data
        return error

    def caller_code(self) -> Any:
        """The code the caller is answered with."""
        return self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, data={self.data!r})"


class ParseError(GatewayError):
    """Raised when a body is not JSON; answered with `id: null`."""

    code = PARSE_ERROR
    error_type = "parse_error"
    structured = False


class InvalidRequest(GatewayError):
    """Raised when JSON is not a valid JSON-RPC 2.0 request."""

    code = INVALID_REQUEST
    error_type = "invalid_request"
    structured = False


class MethodNotFound(GatewayError):
    """Raised for an unknown method and, identically, for a denied one."""

    code = METHOD_NOT_FOUND
    error_type = "method_not_found"
    structured = False

    def __init__(self, method: str) -> None:
        super().__init__("Method not found")
        self.method = method


class InvalidParams(GatewayError):
    """Raised when params have the wrong shape for the method."""

    code = INVALID_PARAMS
    error_type = "invalid_params"
    structured = False


class UnknownTool(InvalidParams):
    """Raised for `tools/call` of an unknown or denied tool; the text is the same for both."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown tool: {name}")


class ArgumentsRefused(InvalidParams):
    """Raised when a client may call a method but its arguments break a policy rule; `data` names the rule."""

    error_type = "arguments_refused"
    structured = True


class HeaderMismatch(GatewayError):
    """An HTTP header of a 2026-07-28 request (MCP-Protocol-Version, Mcp-Method, Mcp-Name, Mcp-Param-*) missing or
    contradicting its body."""

    code = HEADER_MISMATCH
    error_type = "header_mismatch"
    structured = False


class MissingClientCapability(GatewayError):
    """A 2026-07-28 request needs a client capability its `_meta` did not declare; `data.requiredCapabilities` is a
    ClientCapabilities object naming it."""

    code = MISSING_CLIENT_CAPABILITY
    error_type = "missing_client_capability"
    structured = False

    def __init__(self, capability: str, extension: bool = False) -> None:
        # An extension (SEP-2133) is declared under the capabilities' `extensions`, by its identifier.
        required: dict[str, Any] = {"extensions": {capability: {}}} if extension else {capability: {}}
        what = "extension" if extension else "capability"
        super().__init__(f"the client did not declare the {capability!r} {what} this request needs",
                         {"requiredCapabilities": required})


class InputNotRelayed(GatewayError):
    """A tool server of MCP 2026-07-28 answered a call with questions for its caller (an input-required result), and
    this caller cannot be asked: its answer is plain JSON, with no event stream to put them on. The same code a
    relayed request nobody can be asked is refused with (relay.py); `data.asks` names what the server asked."""

    code = METHOD_NOT_FOUND
    error_type = "input_not_relayed"

    def __init__(self, server: str, requests: dict[str, Any]) -> None:
        asks = sorted({str(request.get("method")) for request in requests.values() if isinstance(request, dict)})
        super().__init__(f"tool server {server!r} asked its caller for {', '.join(asks) or 'input'}, and this call "
                         "cannot be asked: its answer is plain JSON (send it with Accept: text/event-stream, in a "
                         "session that declared what is asked)", {"server": server, "asks": asks})


class UnsupportedProtocolVersion(GatewayError):
    """A 2026-07-28 request asks for a version this gateway does not serve per request; `data` lists those it does."""

    code = UNSUPPORTED_PROTOCOL_VERSION
    error_type = "unsupported_protocol_version"
    structured = False

    def __init__(self, requested: str, supported: list[str]) -> None:
        super().__init__("Unsupported protocol version", {"supported": supported, "requested": requested})


class InternalError(GatewayError):
    """Raised when the gateway itself failed; the details stay in the log."""

    code = INTERNAL_ERROR
    error_type = "internal"
    structured = False


class ConfirmationDenied(GatewayError):
    """Raised when the person asked to confirm a call said no; `data` has the approval id and reason."""

    code = CONFIRMATION_DENIED
    error_type = "confirmation_denied"


class ConfirmationExpired(GatewayError):
    """Raised when nobody confirmed a call in time; retrying asks again."""

    code = CONFIRMATION_EXPIRED
    error_type = "confirmation_expired"
    retryable = True


class ConfirmationPending(GatewayError):
    """Raised, at once, for a call whose caller asked not to be held while a person decides: `data` has the approval
    id and where to approve it; the very same call sent again runs once it is approved (confirmation.py)."""

    code = CONFIRMATION_PENDING
    error_type = "confirmation_pending"
    retryable = True


class ToolServerUnavailable(GatewayError):
    """Raised when a tool server could not start, exited mid-call, or is in the failed state."""

    code = TOOL_SERVER_UNAVAILABLE
    error_type = "tool_server_unavailable"
    retryable = True


class ToolServerFailed(ToolServerUnavailable):
    """Raised while a server crashed too often; it stays failed until its config changes."""

    error_type = "tool_server_failed"
    retryable = False


class CallTimedOut(GatewayError):
    """Raised when a tool server did not answer within the call's deadline."""

    code = CALL_TIMED_OUT
    error_type = "call_timed_out"
    retryable = True


class AuditUnavailable(GatewayError):
    """Raised when a call needs a durable audit record that could not be written; the call does not run."""

    code = AUDIT_UNAVAILABLE
    error_type = "audit_unavailable"
    retryable = True


class ShuttingDown(ToolServerUnavailable):
    """Raised for calls that arrive, or are still running, while the daemon stops."""

    error_type = "shutting_down"


class Overloaded(GatewayError):
    """Raised when a server's in-flight limit and wait queue are both full."""

    code = OVERLOADED
    error_type = "overloaded"
    retryable = True


class RequestCancelled(GatewayError):
    """Raised in a call that its client cancelled with `notifications/cancelled`."""

    code = REQUEST_CANCELLED
    error_type = "cancelled"


class UpstreamError(GatewayError):
    """A JSON-RPC error returned by a tool server, passed to the caller verbatim: the tool server's error."""

    error_type = "tool_error"
    structured = False
    source = "tool_server"

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "")), None)
        self.error = error

    def to_wire(self) -> dict[str, Any]:
        """The server's own error object, unchanged."""
        return self.error

    def caller_code(self) -> Any:
        return self.error.get("code")


class ToolFailed(UpstreamError):
    """A direct call of an MCP tool that failed (`isError: true`): on the direct route a tool's failure is a JSON-RPC
    error, whatever the server's protocol, its text as the message and the tool's own result in `data.result`."""

    def __init__(self, result: dict[str, Any]) -> None:
        content = result.get("content")
        texts = [item["text"] for item in content if isinstance(item, dict) and isinstance(item.get("text"), str)] \
            if isinstance(content, list) else []
        message = " ".join(texts)[:TOOL_ERROR_MESSAGE_CHARS] or "the tool failed"
        super().__init__({"code": TOOL_ERROR, "message": message,
                          "data": {"error_type": self.error_type, "retryable": False, "result": result}})


class HttpError(Exception):
    """An HTTP-level refusal (auth, limits, framing); the web layer sends `status` with no JSON-RPC body."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


class Unauthenticated(Exception):
    """No bearer token, a malformed one, or one nobody holds (tokens.py); HTTP 401 with a Bearer challenge."""

    def __init__(self, reason: str, *, invalid_token: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.invalid_token = invalid_token


class TooManySessions(Exception):
    """Every MCP session slot is taken (HTTP 503), or the client holds its whole share of them (HTTP 429)
    (sessions.py); try again a little later, or end a session first."""

    def __init__(self, reason: str, *, client_share: bool = False) -> None:
        super().__init__(reason)
        self.client_share = client_share


# The realm a 401 names; a presented token that matched nobody is also told `error="invalid_token"` (RFC 6750).
BEARER_CHALLENGE = 'Bearer realm="gatewayd"'
# A client refused a session may try again this many seconds later: sessions end as clients leave or idle out.
SESSIONS_RETRY_AFTER = 5


def refusal(exc: Unauthenticated | TooManySessions) -> HttpError:
    """The HTTP answer to a refusal made below the web layer."""
    if isinstance(exc, Unauthenticated):
        challenge = BEARER_CHALLENGE + (', error="invalid_token"' if exc.invalid_token else "")
        return HttpError(401, exc.reason, {"WWW-Authenticate": challenge})
    return HttpError(429 if exc.client_share else 503, str(exc), {"Retry-After": str(SESSIONS_RETRY_AFTER)})


class ConfigError(Exception):
    """A config file that failed validation: names the file, the key and, where known, the line."""

    def __init__(self, file: str, key: str, message: str, line: int | None = None) -> None:
        where = f"{file}:{line}" if line else file
        keypart = f" [{key}]" if key else ""
        super().__init__(f"{where}{keypart}: {message}")
        self.file = file
        self.key = key
        self.line = line
        self.detail = message


def error_response(request_id: Any, error: GatewayError) -> dict[str, Any]:
    """A complete JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_wire()}


class UnknownResource(InvalidParams):
    """Raised for a resource URI nobody the client may read from offers, and, identically, for one it may not read
    (-32602, as MCP's SEP-2164 has it; earlier versions said -32002)."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"Unknown resource: {uri}", {"uri": uri})


class UnknownPrompt(InvalidParams):
    """Raised for `prompts/get` of an unknown or denied prompt; the text is the same for both."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown prompt: {name}")


class UnknownReference(InvalidParams):
    """Raised for `completion/complete` of an unknown or denied prompt or resource template."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown reference: {name}")
