"""Plain JSON-RPC 2.0 calculator over stdio (no MCP handshake): ``python3 -m gatewayd.examples.calc``.

Owns the calculator methods (``add``, ``subtract``, ``multiply``, ``divide``, ``echo``, ``log``) and the
full JSON-RPC 2.0 request/batch semantics for them; framing and the stdout channel come from
``_mcpstdio``. Every method is fast, so requests are answered inline, in order.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable
from typing import Any, Final

from gatewayd.examples._mcpstdio import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Channel,
    JsonObject,
    Request,
    RpcError,
    decode_line,
    error_response,
    log_stderr,
    parse_request,
    response,
    salvage_id,
    stdin_lines,
)

APPLICATION_ERROR: Final = -32000
Number = int | float
Params = JsonObject | list[Any] | None

_ARITHMETIC: Final[dict[str, Callable[[Number, Number], Number]]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "divide": operator.truediv,
}


def _is_number(value: object) -> bool:
    # bool is an int subclass, but true/false are not numbers in JSON.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _operands(params: Params) -> tuple[Number, Number]:
    if isinstance(params, dict) and set(params) == {"a", "b"}:
        a, b = params["a"], params["b"]
    elif isinstance(params, list) and len(params) == 2:
        a, b = params
    else:
        raise RpcError(INVALID_PARAMS, "Invalid params", 'expected {"a": number, "b": number} or [a, b]')
    if not (_is_number(a) and _is_number(b)):
        raise RpcError(INVALID_PARAMS, "Invalid params", "a and b must be numbers")
    return a, b


def _arithmetic(method: str, params: Params) -> Number:
    a, b = _operands(params)
    if method == "divide" and b == 0:
        raise RpcError(APPLICATION_ERROR, "division by zero")
    try:
        result = _ARITHMETIC[method](a, b)
    except OverflowError as exc:  # huge int / huge int
        raise RpcError(APPLICATION_ERROR, "result out of range", str(exc)) from None
    if isinstance(result, float) and not math.isfinite(result):
        raise RpcError(APPLICATION_ERROR, "result out of range", "result is not a finite number")
    return result


def _log(params: Params) -> None:
    message = params.get("message") if isinstance(params, dict) else None
    if not isinstance(message, str):
        raise RpcError(INVALID_PARAMS, "Invalid params", 'expected {"message": string}')
    log_stderr(message)


def call(method: str, params: Params) -> Any:
    """Run one method; raises RpcError for every failure the caller must see."""
    if method == "echo":
        return params
    if method in _ARITHMETIC:
        return _arithmetic(method, params)
    if method == "log":
        _log(params)
        return None
    raise RpcError(METHOD_NOT_FOUND, "Method not found", method)


def handle_message(message: object) -> JsonObject | None:
    """Answer one request object; None when nothing must be sent (notifications)."""
    try:
        request: Request = parse_request(message)
    except RpcError as exc:
        return exc.response(salvage_id(message))
    try:
        result = call(request.method, request.params)
    except RpcError as exc:
        return None if request.is_notification else exc.response(request.id)
    return None if request.is_notification else response(request.id, result)


def handle_line(raw: bytes) -> JsonObject | list[JsonObject] | None:
    """Answer one received line, which may hold a single request or a batch."""
    try:
        message = decode_line(raw)
    except RpcError as exc:
        return exc.response(None)
    if not isinstance(message, list):
        return handle_message(message)
    if not message:
        return error_response(None, INVALID_REQUEST, "Invalid Request", "empty batch")
    replies = [reply for reply in map(handle_message, message) if reply is not None]
    return replies or None  # an all-notification batch produces no output at all


def main() -> int:
    channel = Channel()
    for raw in stdin_lines():
        if raw.strip():
            reply = handle_line(raw)
            if reply is not None:
                channel.send(reply)
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
