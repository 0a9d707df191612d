"""Shared stdio plumbing for the example servers.

Owns the wire rules every example follows: newline-delimited compact JSON-RPC 2.0 framing, a
thread-safe stdout channel (stdout carries protocol only), request validation, and a tiny MCP server
core (handshake, ``tools/list``, ``tools/call`` on worker threads, progress and log notifications,
``notifications/cancelled``). The tool modules (``shell``, ``clock``) own only their tools; ``calc``
reuses the framing and channel but not the MCP core.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO, Final, NamedTuple, TypeGuard

JsonObject = dict[str, Any]
RequestId = str | int | None

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603

SUPPORTED_PROTOCOL_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST_PROTOCOL_VERSION: Final = SUPPORTED_PROTOCOL_VERSIONS[0]

# RFC 5424 severities in increasing order, as used by MCP logging.
LOG_LEVELS: Final = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class RpcError(Exception):
    """A JSON-RPC error to be sent back as the ``error`` member of a response."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def response(self, request_id: RequestId) -> JsonObject:
        return error_response(request_id, self.code, self.message, self.data)


class ToolArgumentError(Exception):
    """Bad tool arguments; reported as an ``isError`` tool result so the model can see and fix it."""


# --- framing -------------------------------------------------------------------------------------------


def encode(message: Any) -> bytes:
    """One compact JSON line; NaN/Infinity are refused because they are not JSON."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_line(raw: bytes) -> Any:
    """Parse one received line, raising a -32700 RpcError for anything that is not strict JSON."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    # ValueError covers bad UTF-8 and Python's int-digit limit; deep nesting raises RecursionError.
    except (ValueError, RecursionError) as exc:
        raise RpcError(PARSE_ERROR, "Parse error", str(exc)) from None


def response(request_id: RequestId, result: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: RequestId, code: int, message: str, data: Any = None) -> JsonObject:
    error: JsonObject = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def notification(method: str, params: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def log_stderr(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


class Channel:
    """Serialises whole lines onto stdout; safe to use from any thread."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._lock = threading.Lock()
        self._closed = False

    def send(self, message: JsonObject | list[JsonObject]) -> None:
        if isinstance(message, list):
            data = b"[" + b",".join(_encode_safely(item).rstrip(b"\n") for item in message) + b"]\n"
        else:
            data = _encode_safely(message)
        if not data:
            return
        with self._lock:
            if self._closed:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except (OSError, ValueError):
                # The reader has gone away; nothing useful can be written any more.
                self._closed = True

    def close(self) -> None:
        # Taking the lock guarantees no worker thread is mid-write when the interpreter shuts down,
        # and later sends from still-running daemon threads are dropped instead of racing shutdown.
        with self._lock:
            self._closed = True
            try:
                self._stream.flush()
            except (OSError, ValueError):
                pass


def _encode_safely(message: JsonObject) -> bytes:
    try:
        return encode(message)
    # Results can hold values JSON cannot carry (inf, ints past the digit limit); the caller
    # still deserves an answer for its id rather than silence.
    except (ValueError, TypeError, RecursionError) as exc:
        if "id" in message and ("result" in message or "error" in message):
            return encode(error_response(message["id"], INTERNAL_ERROR, f"Unencodable result: {exc}"))
        log_stderr(f"dropping unencodable message: {exc}")
        return b""


# --- request validation --------------------------------------------------------------------------------


# NamedTuple and plain classes rather than dataclasses: importing dataclasses (and inspect) is ~12 ms of every
# example server's start, paid on the first call of each lazily started tool server.
class Request(NamedTuple):
    method: str
    params: JsonObject | list[Any] | None
    id: RequestId
    is_notification: bool


def is_valid_id(value: object) -> TypeGuard[RequestId]:
    # bool is an int subclass but never a valid id; fractional ids are discouraged and MCP forbids them.
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def salvage_id(message: object) -> RequestId:
    """The id to use when answering an invalid request: its own id if that id is usable, else null."""
    if isinstance(message, dict):
        candidate = message.get("id")
        if is_valid_id(candidate):
            return candidate
    return None


def is_response(message: object) -> bool:
    return (
        isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
    )


def parse_request(message: object) -> Request:
    """Validate a decoded JSON value as a request or notification, raising -32600 otherwise."""
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request", "expected a JSON object")
    if message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request", 'jsonrpc must be "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "Invalid Request", "method must be a string")
    params = message.get("params")
    if "params" in message and not isinstance(params, dict | list):
        raise RpcError(INVALID_REQUEST, "Invalid Request", "params must be an object or an array")
    request_id = message.get("id")
    if not is_valid_id(request_id):
        raise RpcError(INVALID_REQUEST, "Invalid Request", "id must be a string, an integer or null")
    return Request(method, params, request_id, "id" not in message)


def stdin_lines() -> Iterable[bytes]:
    # Iterating the buffered reader yields each line as soon as it arrives on a pipe.
    return sys.stdin.buffer


# --- tool helpers --------------------------------------------------------------------------------------


def text_result(text: str, *, is_error: bool = False, structured: JsonObject | None = None) -> JsonObject:
    result: JsonObject = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        result["structuredContent"] = structured
    result["isError"] = is_error
    return result


def check_known_arguments(arguments: JsonObject, allowed: Iterable[str]) -> None:
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise ToolArgumentError(f"Invalid arguments: unexpected argument(s) {', '.join(map(repr, unknown))}")


def optional_string(arguments: JsonObject, name: str) -> str | None:
    value = arguments.get(name)
    if value is not None and not isinstance(value, str):
        raise ToolArgumentError(f"Invalid arguments: '{name}' must be a string")
    return value


def require_string(arguments: JsonObject, name: str) -> str:
    value = optional_string(arguments, name)
    if value is None:
        raise ToolArgumentError(f"Invalid arguments: '{name}' is required and must be a string")
    return value


def optional_number(arguments: JsonObject, name: str) -> float | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolArgumentError(f"Invalid arguments: '{name}' must be a number")
    return float(value)


def require_int(arguments: JsonObject, name: str, minimum: int, maximum: int) -> int:
    value = arguments.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ToolArgumentError(
            f"Invalid arguments: '{name}' is required and must be an integer from {minimum} to {maximum}"
        )
    return value


# --- MCP core ------------------------------------------------------------------------------------------


class CallContext:
    """What a tool handler may use while it runs: progress, logging and cancellation."""

    def __init__(self, server: McpServer, request_id: RequestId, progress_token: str | int | None) -> None:
        self.server = server
        self.request_id = request_id
        self.progress_token = progress_token
        self.cancelled = threading.Event()
        self._cancel_callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        if self.progress_token is None or self.cancelled.is_set():
            return
        params: JsonObject = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        self.server.channel.send(notification("notifications/progress", params))

    def log(self, level: str, logger: str, data: Any) -> None:
        if not self.cancelled.is_set():
            self.server.send_log(level, logger, data)

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the call is cancelled (at once if it already was)."""
        with self._lock:
            if not self.cancelled.is_set():
                self._cancel_callbacks.append(callback)
                return
        callback()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.set()
            callbacks, self._cancel_callbacks = self._cancel_callbacks, []
        for callback in callbacks:
            callback()


ToolHandler = Callable[[JsonObject, CallContext], JsonObject]


class Tool(NamedTuple):
    name: str
    description: str
    input_schema: JsonObject
    handler: ToolHandler
    annotations: JsonObject | None = None
    # Slow tools get their own thread so pings and other calls are answered meanwhile.
    blocking: bool = False

    def describe(self) -> JsonObject:
        described: JsonObject = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.annotations is not None:
            described["annotations"] = self.annotations
        return described


def negotiate_protocol_version(params: JsonObject | list[Any] | None) -> str:
    requested = params.get("protocolVersion") if isinstance(params, dict) else None
    return requested if requested in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION


def progress_token_of(params: JsonObject | list[Any] | None) -> str | int | None:
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if is_valid_id(token) else None


class McpServer:
    """A minimal MCP server over stdio: tools, logging and cancellation, nothing else."""

    def __init__(
        self, name: str, version: str, tools: Sequence[Tool], channel: Channel | None = None
    ) -> None:
        self.channel = channel if channel is not None else Channel()
        self._server_info = {"name": name, "version": version}
        self._tools = {tool.name: tool for tool in tools}
        self._inflight: dict[RequestId, CallContext] = {}
        self._inflight_lock = threading.Lock()
        self._min_log_level = 0
        self._methods: dict[str, Callable[[JsonObject | list[Any] | None], JsonObject]] = {
            "initialize": self._initialize,
            "ping": lambda _params: {},
            "logging/setLevel": self._set_level,
            "tools/list": lambda _params: {"tools": [tool.describe() for tool in self._tools.values()]},
        }

    def serve(self, lines: Iterable[bytes] | None = None) -> int:
        for raw in stdin_lines() if lines is None else lines:
            self.handle_line(raw)
        self._shutdown()
        return 0

    def send_log(self, level: str, logger: str, data: Any) -> None:
        if LOG_LEVELS.index(level) >= self._min_log_level:
            self.channel.send(
                notification("notifications/message", {"level": level, "logger": logger, "data": data})
            )

    def handle_line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            message = decode_line(raw)
        except RpcError as exc:
            self.channel.send(exc.response(None))
            return
        if isinstance(message, list):
            # MCP dropped JSON-RPC batching in 2025-06-18; one error for the whole array.
            self.channel.send(
                error_response(None, INVALID_REQUEST, "Invalid Request", "batches are not supported")
            )
            return
        if is_response(message):
            return  # we never send requests, so there is nothing to match it against
        try:
            request = parse_request(message)
        except RpcError as exc:
            self.channel.send(exc.response(salvage_id(message)))
            return
        self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        if request.method == "notifications/cancelled":
            self._cancel(request.params)
            return
        if request.is_notification:
            return  # notifications/initialized and friends need no action and never get replies
        if request.method == "tools/call":
            self._start_call(request)
            return
        method = self._methods.get(request.method)
        if method is None:
            self.channel.send(
                error_response(request.id, METHOD_NOT_FOUND, "Method not found", request.method)
            )
            return
        try:
            self.channel.send(response(request.id, method(request.params)))
        except RpcError as exc:
            self.channel.send(exc.response(request.id))

    def _initialize(self, params: JsonObject | list[Any] | None) -> JsonObject:
        return {
            "protocolVersion": negotiate_protocol_version(params),
            "capabilities": {"tools": {}, "logging": {}},
            "serverInfo": self._server_info,
        }

    def _set_level(self, params: JsonObject | list[Any] | None) -> JsonObject:
        level = params.get("level") if isinstance(params, dict) else None
        if level not in LOG_LEVELS:
            raise RpcError(INVALID_PARAMS, "Invalid params", f"level must be one of {', '.join(LOG_LEVELS)}")
        self._min_log_level = LOG_LEVELS.index(level)
        return {}

    def _start_call(self, request: Request) -> None:
        params = request.params
        name = params.get("name") if isinstance(params, dict) else None
        arguments = params.get("arguments") if isinstance(params, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, dict | None):
            self.channel.send(
                error_response(
                    request.id, INVALID_PARAMS, "Invalid params", "need name (string), arguments (object)"
                )
            )
            return
        tool = self._tools.get(name)
        if tool is None:
            self.channel.send(response(request.id, text_result(f"Unknown tool: {name}", is_error=True)))
            return
        context = CallContext(self, request.id, progress_token_of(params))
        with self._inflight_lock:
            duplicate = request.id in self._inflight
            if not duplicate:
                self._inflight[request.id] = context
        if duplicate:
            self.channel.send(
                error_response(request.id, INVALID_REQUEST, "Invalid Request", "duplicate id in flight")
            )
            return
        args = arguments or {}
        if tool.blocking:
            threading.Thread(
                target=self._run_call, args=(tool, args, context), name=f"call-{request.id}", daemon=True
            ).start()
        else:
            self._run_call(tool, args, context)

    def _run_call(self, tool: Tool, arguments: JsonObject, context: CallContext) -> None:
        try:
            result = tool.handler(arguments, context)
        except ToolArgumentError as exc:
            result = text_result(str(exc), is_error=True)
        except Exception as exc:  # a broken tool must not take the server down with it
            import traceback  # only when a handler fails: not worth its import time at every start

            log_stderr(traceback.format_exc())
            result = text_result(f"Tool {tool.name} failed: {exc}", is_error=True)
        finally:
            with self._inflight_lock:
                self._inflight.pop(context.request_id, None)
        if not context.cancelled.is_set():  # cancelled requests get no response at all
            self.channel.send(response(context.request_id, result))

    def _cancel(self, params: JsonObject | list[Any] | None) -> None:
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if request_id is None or not is_valid_id(request_id):
            return
        with self._inflight_lock:
            context = self._inflight.get(request_id)
        if context is not None:
            context.cancel()

    def _shutdown(self) -> None:
        # stdin EOF means the client is gone: stop in-flight work (e.g. kill shell commands) and exit.
        with self._inflight_lock:
            contexts = list(self._inflight.values())
        for context in contexts:
            context.cancel()
        self.channel.close()
