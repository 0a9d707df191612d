"""The one strict parse of a JSON-RPC body."""

from __future__ import annotations

import json

import pytest

from gatewayd.errors import InvalidRequest, ParseError
from gatewayd.jsonrpc import Invalid, Notification, Request, Response, dumps, parse_body

LIMITS = {"max_depth": 8, "max_batch": 3}


def one(body: bytes) -> object:
    parsed = parse_body(body, **LIMITS)
    assert not parsed.is_batch
    return parsed.messages[0]


def test_request_notification_and_response() -> None:
    assert one(b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":{"x":1}}') == Request(1, "a.b", {"x": 1})
    assert one(b'{"jsonrpc":"2.0","method":"a.b"}') == Notification("a.b", None)
    assert one(b'{"jsonrpc":"2.0","id":"7","result":{"ok":true}}') == Response("7", {"ok": True}, None)


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"1.0","id":1,"method":"a.b"}',
        b'{"id":1,"method":"a.b"}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":"x"}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":3}',
        b'{"jsonrpc":"2.0","id":{"x":1},"method":"a.b"}',
        b'{"jsonrpc":"2.0","id":true,"method":"a.b"}',
        b'{"jsonrpc":"2.0","id":1,"method":["a.b"]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","extra":1}',
        b'{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1}}',
        b'"just a string"',
        b"42",
    ],
)
def test_invalid_requests(body: bytes) -> None:
    message = one(body)
    assert isinstance(message, Invalid)
    assert isinstance(message.error, InvalidRequest)


def test_invalid_request_keeps_a_valid_id() -> None:
    message = one(b'{"jsonrpc":"2.0","id":5,"method":"a.b","params":"x"}')
    assert isinstance(message, Invalid) and message.id == 5


@pytest.mark.parametrize("body", [b"{", b"", b"\xff\xfe", b'{"a":1}x', b"NaN-ish"])
def test_parse_errors(body: bytes) -> None:
    with pytest.raises(ParseError):
        parse_body(body, **LIMITS)


def test_duplicate_keys_anywhere_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="duplicate key"):
        parse_body(b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":{"x":1,"x":2}}', **LIMITS)


def test_depth_limit_is_crossed_exactly() -> None:
    def nested(depth: int) -> bytes:
        return b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    assert isinstance(one(nested(LIMITS["max_depth"])), Request)
    with pytest.raises(InvalidRequest, match="nested deeper"):
        parse_body(nested(LIMITS["max_depth"] + 1), **LIMITS)


def test_pathologically_deep_json_is_refused_not_crashed() -> None:
    with pytest.raises(InvalidRequest):
        parse_body(b"[" * 200_000 + b"]" * 200_000, **LIMITS)


def test_batch_limits() -> None:
    element = b'{"jsonrpc":"2.0","id":1,"method":"a.b"}'
    assert len(parse_body(b"[" + b",".join([element] * 3) + b"]", **LIMITS).messages) == 3
    with pytest.raises(InvalidRequest, match="batch longer"):
        parse_body(b"[" + b",".join([element] * 4) + b"]", **LIMITS)
    with pytest.raises(InvalidRequest, match="empty batch"):
        parse_body(b"[]", **LIMITS)


def test_dumps_is_one_line_even_for_multiline_strings() -> None:
    encoded = dumps({"text": "line1\nline2", "nested": {"a": [1, 2]}, "unicode": "é"})
    assert b"\n" not in encoded
    assert encoded == '{"text":"line1\\nline2","nested":{"a":[1,2]},"unicode":"é"}'.encode()


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[NaN]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[Infinity]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[-Infinity]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[1e400]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":{"x":-1.5e309}}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":["\\ud800"]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":{"\\uDFFF":1}}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[' + b"9" * 100_000 + b"]}",
        b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"a.b"}',
    ],
)
def test_values_that_cannot_be_sent_on_are_parse_errors(body: bytes) -> None:
    with pytest.raises(ParseError):
        parse_body(body, **LIMITS)


def test_more_objects_than_the_limit_are_an_invalid_request_and_braces_in_strings_do_not_count() -> None:
    many = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "a.b", "params": [{} for _ in range(100)]}).encode()
    with pytest.raises(InvalidRequest, match="more than 50 JSON objects"):
        parse_body(many, max_objects=50, **LIMITS)
    assert len(parse_body(many, max_objects=101, **LIMITS).messages) == 1
    braces = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "a.b", "params": ["{" * 1000]}).encode()
    assert len(parse_body(braces, max_objects=50, **LIMITS).messages) == 1


def test_ids_and_method_names_are_short_labels() -> None:
    longest = one(json.dumps({"jsonrpc": "2.0", "id": "i" * 256, "method": "m" * 1024}).encode())
    assert isinstance(longest, Request)
    for message in ({"jsonrpc": "2.0", "id": "i" * 257, "method": "a.b"},
                    {"jsonrpc": "2.0", "id": 2**63, "method": "a.b"},
                    {"jsonrpc": "2.0", "id": 1, "method": "m" * 1025}):
        invalid = one(json.dumps(message).encode())
        assert isinstance(invalid, Invalid) and invalid.error.code == -32600


def test_large_finite_numbers_are_kept_and_nothing_encodes_to_infinity() -> None:
    message = one(b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":[1e308, 123456789012345678901234567890]}')
    assert isinstance(message, Request) and message.params == [1e308, 123456789012345678901234567890]
    with pytest.raises(ValueError):
        dumps({"x": float("inf")})
    with pytest.raises(ValueError):
        dumps([float("nan")])


def test_a_surrogate_pair_is_a_character_not_an_error() -> None:
    message = one(b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":["\\ud83d\\ude00"]}')
    assert message == Request(1, "a.b", ["\U0001f600"])
