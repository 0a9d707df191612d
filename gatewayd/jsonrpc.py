"""JSON-RPC 2.0 messages: the one strict parse of a body, message shapes and encoding.

Owns: turning bytes into `Request` / `Notification` / `Response` objects (or the error each
malformed element earns), batch rules, nesting-depth and duplicate-key refusal, and compact
single-line encoding, and `Encoded`: a result answered many times whose text is made once, each answer's id
spliced in. Does not own: what a method means (gateway.py) or HTTP (web/).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from gatewayd import jsontext
from gatewayd.errors import GatewayError, InvalidRequest, ParseError, error_response
from gatewayd.values import value

JsonId = str | int | None
Params = dict[str, Any] | list[Any] | None

# A request id or a method name is a short label. Longer ones are refused (Invalid Request) at the door, before an
# answer must echo them back or an audit record and a log line carry them.
MAX_ID_CHARS = 256
MAX_ID_INT = 2**63
MAX_METHOD_CHARS = 1024


@value
class Request:
    """A call that expects an answer."""

    id: JsonId
    method: str
    params: Params


@value
class Notification:
    """A call that never gets an answer, not even an error."""

    method: str
    params: Params


@value
class Response:
    """A client's answer to a request the gateway sent it (e.g. elicitation)."""

    id: JsonId
    result: Any
    error: dict[str, Any] | None


@value
class Invalid:
    """An element that is not a valid message; answered with `error` and the id it carried, if any."""

    id: JsonId
    error: GatewayError


Message = Request | Notification | Response | Invalid


@value
class Body:
    """A parsed HTTP body: one message, or a batch of them, and its size in bytes."""

    messages: list[Message]
    is_batch: bool
    size: int = 0


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey("duplicate key in a JSON object")
    return obj


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON; Python accepts them by default and they cannot be sent on faithfully.
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    # A number too large for a double (1e400) would become Infinity, which no JSON peer can read back.
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is too large for a JSON number")
    return value


_decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite)
# The escape a lone surrogate needs (`\uD800`-`\uDFFF`); found ~4× sooner in a large body by the regular expression
# engine than by two substring searches (1.6 ms a MiB here, each pass holding the event loop's interpreter).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_decode = jsontext.decoding(_decoder)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit`, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class _TooManyObjects(ValueError):
    pass


def _counting_decoder(limit: int) -> json.JSONDecoder:
    """A decoder like `_decoder` that stops at the `limit`-th + 1 object instead of parsing the rest."""
    seen = 0

    def no_duplicates_counted(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if seen > limit:
            raise _TooManyObjects(f"more than {limit} JSON objects")
        return _no_duplicates(pairs)

    return json.JSONDecoder(object_pairs_hook=no_duplicates_counted, parse_constant=_no_constants,
                            parse_float=_finite)


def loads(data: bytes | str) -> Any:
    """Decode JSON strictly: duplicate keys and numbers that are not finite are refused. Raises ValueError or
    RecursionError."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return _decode(text)


def parse_body(data: bytes, *, max_depth: int, max_batch: int, max_objects: int | None = None) -> Body:
    """Parse an HTTP body into messages. Raises ParseError or InvalidRequest for the body as a whole."""
    # Counted once, at C speed, strings included: ~0.4 ms a MiB each.
    braces = data.count(b"{")
    try:
        # Fewer opening braces than the limit cannot be too many objects.
        if max_objects is not None and braces > max_objects:
            value = _counting_decoder(max_objects).decode(data.decode("utf-8"))
        else:
            value = loads(data)
    except _TooManyObjects as exc:
        raise InvalidRequest(f"Invalid Request: {exc}") from exc
    except _DuplicateKey as exc:
        raise InvalidRequest("Invalid Request: duplicate key in a JSON object") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"Invalid Request: JSON nested deeper than {max_depth}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError("Parse error") from exc
    # Nesting needs an opening bracket per level: a body with few of them cannot be too deep.
    if (braces > max_depth or braces + data.count(b"[") > max_depth) and _depth_exceeds(value, max_depth):
        raise InvalidRequest(f"Invalid Request: JSON nested deeper than {max_depth}")
    # A lone surrogate can only come from a `\uD8xx` escape; it has no UTF-8 form to send on.
    if _SURROGATE_ESCAPE.search(data) is not None and not _encodable(value):
        raise ParseError("Parse error")
    if isinstance(value, list):
        if not value:
            raise InvalidRequest("Invalid Request: empty batch")
        if len(value) > max_batch:
            raise InvalidRequest(f"Invalid Request: batch longer than {max_batch}")
        return Body([parse_message(item) for item in value], True, len(data))
    return Body([parse_message(value)], False, len(data))


def _encodable(value: Any) -> bool:
    try:
        dumps(value)
    except UnicodeEncodeError:
        return False
    return True


def _valid_id(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS
    if isinstance(value, int) and not isinstance(value, bool):
        return -MAX_ID_INT <= value < MAX_ID_INT
    return value is None


def parse_message(value: Any) -> Message:
    """Classify one decoded JSON value as a message, or as Invalid with the error it earns."""
    if not isinstance(value, dict):
        return Invalid(None, InvalidRequest("Invalid Request"))
    raw_id = value.get("id")
    valid_id = _valid_id(raw_id)
    msg_id = raw_id if valid_id else None
    if value.get("jsonrpc") != "2.0" or not valid_id:
        return Invalid(msg_id, InvalidRequest("Invalid Request"))
    if "method" in value:
        return _parse_call(value, msg_id)
    if "id" in value and (("result" in value) != ("error" in value)):
        error = value.get("error")
        if error is not None and not isinstance(error, dict):
            return Invalid(msg_id, InvalidRequest("Invalid Request"))
        return Response(msg_id, value.get("result"), error)
    return Invalid(msg_id, InvalidRequest("Invalid Request"))


_CALL_KEYS = frozenset({"jsonrpc", "method", "params", "id"})


def _parse_call(value: dict[str, Any], msg_id: JsonId) -> Message:
    method = value["method"]
    params = value.get("params")
    if not isinstance(method, str) or not value.keys() <= _CALL_KEYS:
        return Invalid(msg_id, InvalidRequest("Invalid Request"))
    if len(method) > MAX_METHOD_CHARS:
        return Invalid(msg_id, InvalidRequest(f"Invalid Request: a method name is at most {MAX_METHOD_CHARS} "
                                              "characters"))
    if "params" in value and not isinstance(params, dict | list):
        return Invalid(msg_id, InvalidRequest("Invalid Request: params must be an object or an array"))
    if "id" in value:
        return Request(msg_id, method, params)
    return Notification(method, params)


# Made once: this runs twice per call. NaN and Infinity are not JSON: encoding one raises ValueError rather than
# sending a peer a line it cannot parse (nothing parsed strictly can hold one).
_encode = jsontext.encoder(allow_nan=False)


# A success response's keys in the order `result_response` makes them: the text before its id is always the same.
_RESPONSE_KEYS = ("jsonrpc", "id", "result")
_RESPONSE_HEAD = b'{"jsonrpc":"2.0","id":'
_RESULT_KEY = b',"result":'
# Results derived from one Encoded (its pages, its modern form) kept with it, all dropped at once past this many.
MAX_DERIVED = 16


def dumps(obj: Any) -> bytes:
    """Compact single-line UTF-8 JSON: safe for one SSE `data:` line and one stdio line. Raises ValueError for a
    number that is not finite. A success response whose result is `Encoded` is its head, its id and the result's
    text made once: the same bytes, without encoding the result again."""
    result = obj.get("result") if type(obj) is dict else None
    if type(result) is Encoded and tuple(obj) == _RESPONSE_KEYS and obj["jsonrpc"] == "2.0":
        return _RESPONSE_HEAD + _encode(obj["id"]).encode("utf-8") + result.tail()
    return _encode(obj).encode("utf-8")


def dumps_text(obj: Any) -> str:
    """The text `dumps` encodes."""
    return _encode(obj)


def _read_only(self: Encoded, *args: Any, **kwargs: Any) -> Any:
    raise TypeError("an Encoded result is answered as it was made: change a copy of it")


class ReadOnlyList(list[Any]):
    """A list read as any list (and encoded as one) that refuses to be changed: the items of an Encoded result."""

    __slots__ = ()

    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = \
        reverse = _read_only


class Encoded(dict[str, Any]):
    """A result answered many times as it is (the 2,000-tool `tools/list` of one principal, ~260 KB): its JSON text
    is made on its first answer and kept, so that each later answer only splices its own id in front (`dumps`;
    encoding it took 4-6 ms). Read as any dict; refuses to be changed, since its text would no longer say what it
    holds (the lists it is given as ReadOnlyList likewise). Whoever keeps one makes a new one when what it was
    made from changes (catalog.py, surfaces.py). Results made from it (a page, the modern era's form) are kept
    with it too."""

    __slots__ = ("_tail", "_derived")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tail: bytes | None = None
        self._derived: dict[Any, tuple[Any, Encoded]] = {}

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only

    def tail(self) -> bytes:
        """What follows the id in a response carrying this result: `,"result":<its JSON>}`, made once."""
        if self._tail is None:
            self._tail = _RESULT_KEY + _encode(self).encode("utf-8") + b"}"
        return self._tail

    def derived(self, key: Any, check: Any, make: Callable[[], Encoded]) -> Encoded:
        """The result made from this one under `key` (a page of it, its modern form), made by `make` once while what
        it also depends on stays equal to `check`."""
        kept = self._derived.get(key)
        if kept is not None and kept[0] == check:
            return kept[1]
        if len(self._derived) >= MAX_DERIVED:
            self._derived.clear()
        made = make()
        self._derived[key] = (check, made)
        return made


def result_response(request_id: JsonId, result: Any) -> dict[str, Any]:
    """A complete JSON-RPC success response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


__all__ = [
    "Body",
    "Encoded",
    "Invalid",
    "Message",
    "Notification",
    "Request",
    "Response",
    "dumps",
    "error_response",
    "loads",
    "parse_body",
    "parse_message",
    "result_response",
]
