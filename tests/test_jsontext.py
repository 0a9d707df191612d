"""The reusable encoders give exactly the standard library's text, for every option gatewayd uses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gatewayd import jsontext

VALUES: list[Any] = [
    None, True, 0, -1, 10**30, 1.5, -0.0, 1e300, "", "plain", "é\u2028\u0000\"\\/\ud800", [], {},
    {"b": [1, {"y": None, "x": [True, "é"]}], "a": 2.25, "": ""}, [[[]], {"k": {}}],
]
OPTIONS: list[dict[str, Any]] = [
    {},
    {"sort_keys": True, "default": str},
    {"allow_nan": False, "default": str},
    {"separators": (", ", ": ")},
    {"ensure_ascii": True},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_text_is_the_standard_text(options: dict[str, Any]) -> None:
    fast = jsontext.encoder(**options)
    standard = json.JSONEncoder(**{"separators": jsontext.COMPACT, "ensure_ascii": False, **options})
    for value in VALUES:
        assert fast(value) == standard.encode(value), value


def test_default_is_applied_to_what_json_cannot_hold() -> None:
    assert jsontext.encoder(default=str)({"when": range(2)}) == '{"when":"range(0, 2)"}'
    with pytest.raises(TypeError):
        jsontext.encoder()({"when": range(2)})


def test_non_finite_numbers_follow_allow_nan() -> None:
    assert jsontext.encoder()([float("nan"), float("-inf")]) == "[NaN,-Infinity]"
    with pytest.raises(ValueError):
        jsontext.encoder(allow_nan=False)({"x": float("inf")})


def test_a_cycle_raises_instead_of_hanging() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(RecursionError):
        jsontext.encoder()(looped)


def test_without_the_c_encoder_the_standard_one_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    encode = jsontext.encoder(sort_keys=True)
    assert encode({"b": 1, "a": [None]}) == '{"a":[null],"b":1}'
    assert getattr(encode, "__self__", None).__class__ is json.JSONEncoder


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _outcome(decode: jsontext.Decode, text: str) -> tuple[str, Any]:
    try:
        return "value", decode(text)
    except Exception as exc:  # the same type and message is what is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("text", [
    '{"jsonrpc":"2.0","id":1,"result":{"a":[1,2.5,null,true]}}', "[]", '"text"', "0",
    ' {"a":1}', '{"a":1}\n', '\t[1] ', '{"a":1} x', '{"a":1}{"b":2}', "", " ", "x", '{"a":', '{"a" 1}',
    '{"a":1,"a":2}', "NaN", "[1,]", '"\\ud800"',
])
def test_decoding_gives_what_the_decoder_gives(text: str) -> None:
    decoder = json.JSONDecoder(object_pairs_hook=_refuse_duplicates)
    assert _outcome(jsontext.decoding(decoder), text) == _outcome(decoder.decode, text)


def test_decoding_without_a_scanner_is_the_decoder_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = json.JSONDecoder()
    monkeypatch.delattr(decoder, "scan_once")
    assert jsontext.decoding(decoder) == decoder.decode
