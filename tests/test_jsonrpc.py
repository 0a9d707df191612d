"""The one strict parse of a JSON-RPC body."""

from __future__ import annotations

import json

import pytest

from gatewayd import modern
from gatewayd.errors import InvalidRequest, ParseError
from gatewayd.jsonrpc import (
    MAX_DERIVED,
    Encoded,
    Invalid,
    Notification,
    ReadOnlyList,
    Request,
    Response,
    dumps,
    parse_body,
    result_response,
)

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

    def objects(depth: int) -> bytes:
        return b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":' + b'{"a":' * (depth - 2) + b"{}" + b"}" * (depth - 1)

    for made in (nested, objects):
        assert isinstance(one(made(LIMITS["max_depth"])), Request)
        with pytest.raises(InvalidRequest, match="nested deeper"):
            parse_body(made(LIMITS["max_depth"] + 1), **LIMITS)


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
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":["ok \\\\ \\udBfF"]}',
        b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":["' + b"x" * 1_000_000 + b'\\uDa00"]}',
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
    # An escaped backslash before `ud800` is a backslash and text, not a surrogate.
    assert one(b'{"jsonrpc":"2.0","id":1,"method":"a.b","params":["\\\\ud800"]}') == Request(1, "a.b", ["\\ud800"])


LISTING = {"tools": [{"name": "a__one", "description": "é \u2028 \"q\"", "inputSchema": {"type": "object"}},
                     {"name": "b__two", "n": [1, -2.5, None, True]}]}


@pytest.mark.parametrize("request_id", [1, 0, -7, 2**63 - 1, "", "x", 'q"\\é\u2028\x01', None])
def test_an_encoded_result_answers_the_same_bytes_with_each_id_spliced_in(request_id: object) -> None:
    remembered = Encoded(tools=ReadOnlyList(LISTING["tools"]))
    for _ in range(2):  # the first answer makes the text, the second reuses it
        spliced = dumps(result_response(request_id, remembered))  # type: ignore[arg-type]
        assert spliced == dumps(result_response(request_id, json.loads(json.dumps(LISTING))))  # type: ignore[arg-type]
        assert json.loads(spliced) == {"jsonrpc": "2.0", "id": request_id, "result": LISTING}
    # In a batch, or in any other shape, it is encoded as the dict it is.
    batch = [result_response(1, remembered), {"jsonrpc": "2.0", "id": 2, "error": {"code": 1, "message": "m"}}]
    assert dumps(batch) == dumps(json.loads(json.dumps(batch)))
    assert dumps({"id": request_id, "jsonrpc": "2.0", "result": remembered}) \
        == dumps({"id": request_id, "jsonrpc": "2.0", "result": LISTING})


def test_an_encoded_result_and_its_lists_refuse_to_change() -> None:
    remembered = Encoded(tools=ReadOnlyList(LISTING["tools"]))
    with pytest.raises(TypeError):
        remembered["tools"] = []
    with pytest.raises(TypeError):
        remembered.update(more=1)
    with pytest.raises(TypeError):
        remembered["tools"].append({})
    with pytest.raises(TypeError):
        remembered["tools"][0] = {}
    # A copy is a plain dict, changed freely; a slice a plain list.
    copy = {**remembered, "nextCursor": "c"}
    assert type(copy) is dict and type(remembered["tools"][:1]) is list
    assert dumps(result_response(1, remembered)) == dumps(result_response(1, LISTING))


def test_results_made_from_an_encoded_one_are_kept_with_it_up_to_the_limit() -> None:
    remembered = Encoded(tools=ReadOnlyList(LISTING["tools"]))
    info = {"name": "gatewayd", "version": "1"}
    finished = modern.finish("tools/list", remembered, info)
    assert isinstance(finished, Encoded) and finished["resultType"] == "complete" and finished["ttlMs"] == 0
    assert modern.finish("tools/list", remembered, dict(info)) is finished
    # Made anew when what it also depends on changed.
    other = modern.finish("tools/list", remembered, {**info, "version": "2"})
    assert other is not finished and other["_meta"][modern.SERVER_INFO_KEY]["version"] == "2"
    remembered = Encoded(tools=ReadOnlyList(LISTING["tools"]))
    made = [remembered.derived(key, None, lambda: Encoded(k=1)) for key in range(MAX_DERIVED)]
    assert all(remembered.derived(key, None, lambda: Encoded()) is made[key] for key in range(MAX_DERIVED - 1))
    # One more than the limit drops those kept before, all at once.
    remembered.derived(MAX_DERIVED, None, lambda: Encoded())
    assert remembered.derived(0, None, lambda: Encoded(k=2)) is not made[0]
