"""JSON text on the hot path: encoders whose C core is made once, not on every call, and decoders without the
whitespace look-ups around the value.

`json.JSONEncoder.encode` builds its C encoder anew on every call. For the small messages of a
tool call that set-up is about a third of the cost (1.1 of 2.2 µs for a two-key object here), and
one call encodes five or six times. `encoder(...)` gives `JSONEncoder(...).encode`'s text without
that set-up and without circular-reference detection: a cyclic value raises RecursionError instead
of ValueError. What gatewayd encodes comes from parsed JSON or its own builders, so it is a tree.
Where the C encoder is missing, or does not give the same text as `JSONEncoder`, `encoder` falls
back to `JSONEncoder.encode`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _std
from typing import Any

Encode = Callable[[Any], str]
Decode = Callable[[str], Any]

COMPACT = (",", ":")
# A value touching every branch of the encoder, to check the fast path against the standard one.
_PROBE = {"z": [1, -2.5, True, False, None, "é\u2028\"\\\x01"], "a": {"n": 10**20, "e": {}, "l": []}}


def encoder(
    *,
    separators: tuple[str, str] = COMPACT,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
    allow_nan: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> Encode:
    """A function giving `json.JSONEncoder(**options).encode(value)`, made once and reused."""
    plain = json.JSONEncoder(separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii,
                             allow_nan=allow_nan, default=default)
    make = getattr(_std, "c_make_encoder", None)
    if make is None:
        return plain.encode
    strings: Callable[[str], str] = _std.encode_basestring_ascii if ensure_ascii else _std.encode_basestring
    try:
        core = make(None, plain.default, strings, None, plain.key_separator, plain.item_separator, sort_keys,
                    plain.skipkeys, allow_nan)
    except TypeError:
        return plain.encode

    def encode(value: Any) -> str:
        return "".join(core(value, 0))

    try:
        same = encode(_PROBE) == plain.encode(_PROBE)
    except Exception:
        same = False
    return encode if same else plain.encode


def decoding(decoder: json.JSONDecoder) -> Decode:
    """`decoder.decode`, calling its scanner directly: `decode` matches a whitespace pattern before and after the
    value (two regular-expression calls, ~90 bytecodes with its wrapper around the scanner), and a line or body
    from a JSON-RPC peer seldom has any. Text with whitespace around its value, or that is no JSON value at all,
    goes to `decoder.decode` itself, which gives the same value or raises the same error. (Its hooks may then run
    twice for one text: gatewayd's are pure.)"""
    plain = decoder.decode
    scan: Callable[[str, int], tuple[Any, int]] | None = getattr(decoder, "scan_once", None)
    if scan is None:
        return plain

    def decode(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except StopIteration:
            return plain(text)
        return value if end == len(text) else plain(text)

    return decode
