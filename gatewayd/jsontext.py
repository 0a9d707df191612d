"""JSON text on the hot path: encoders whose C core is made once, not on every call, and decoders without the
whitespace look-ups around the value.

`json.JSONEncoder.encode` builds its C encoder anew on every call. For the small messages of a
tool call that set-up is about a third of the cost (1.1 of 2.2 µs for a two-key object here), and
one call encodes five or six times. `encoder(...)` gives `JSONEncoder(...).encode`'s text without
that set-up and without circular-reference detection: a cyclic value raises RecursionError instead
of ValueError. What gatewayd encodes comes from parsed JSON or its own builders, so it is a tree.
Where the C encoder is missing, or does not give the same text as `JSONEncoder`, `encoder` falls
back to `JSONEncoder.encode`.

A string longer than LARGE_STRING is a large one: `carries_large_string` looks for one near the top of a value
(where a tool's text or a resource's blob sits), and `string_text` makes such a string's JSON text from its UTF-8
bytes, ~5× cheaper than the per-character escaper when it holds nothing to escape. web/bodies.py writes answers
holding one in slices; audit.py hashes arguments holding one without the escaper.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from json import encoder as _std
from typing import Any, Final

Encode = Callable[[Any], str]
Decode = Callable[[str], Any]

# A string value longer than this (in characters) is a large one.
LARGE_STRING: Final = 256 * 1024
# How much of a value is looked through for a large string (values, and levels of nesting): enough for any result's
# text or blob, little enough that the look costs a small answer about a microsecond.
SCAN_VALUES: Final = 64
SCAN_DEPTH: Final = 6
# What `_scan` returns when it found a large string; otherwise the values left to look at (0: it looked enough).
_FOUND: Final = -1
_escape = _std.encode_basestring
# Each byte JSON escapes in a string (a control character, a quote, a backslash) maps to 0, every other byte to 1.
# Only ASCII is ever escaped (ensure_ascii is off), and in UTF-8 no byte of a longer character is ASCII.
_UNESCAPED: Final = bytes(0 if byte < 0x20 or byte in b'"\\' else 1 for byte in range(256))

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


def carries_large_string(value: Any) -> bool:
    """Whether a string longer than LARGE_STRING is among the first SCAN_VALUES values of `value`, within
    SCAN_DEPTH levels."""
    return type(value) in (dict, list) and _scan(value, SCAN_DEPTH, SCAN_VALUES) == _FOUND


def _scan(container: dict[Any, Any] | list[Any], depth: int, budget: int) -> int:
    # On every answer: plain loops and type identity, about a microsecond for a tool call's result. Identity also
    # passes over jsonrpc.Encoded (a kept listing, a dict subclass): its text is made once already, not here.
    for item in container.values() if type(container) is dict else container:
        budget -= 1
        if budget <= 0:
            return 0
        kind = type(item)
        if kind is str:
            if len(item) > LARGE_STRING:
                return _FOUND
        elif depth and (kind is dict or kind is list):
            budget = _scan(item, depth - 1, budget)
            if budget <= 0:
                return budget
    return budget


def string_text(text: str, errors: str = "strict") -> bytes:
    """A string's JSON text without its quotes, in UTF-8 (`errors` as str.encode takes it: "surrogatepass" lets a
    lone surrogate through), as the compact encoders here write it. A large text rarely holds anything JSON escapes:
    that is found on its UTF-8 bytes with one table look-up a byte, ~3× cheaper than escaping it a character at a
    time (bench.scale's payload: ~9 of the daemon's ~40 ms for 10 MiB). A newline or a quote, which code and JSON
    text hold at once, is looked for first at memchr speed: such a text goes straight to the escaper (×0.82 its cost
    for 1 MiB of code), any other pays ~1% more."""
    raw = text.encode("utf-8", errors)
    if b"\n" not in raw and b'"' not in raw and raw.translate(_UNESCAPED).find(0) < 0:
        return raw
    return _escape(text)[1:-1].encode("utf-8", errors)


def parts(value: Any, whole: Callable[[Any], bytes], *, sort_keys: bool = False, errors: str = "strict",
          slice_chars: int = LARGE_STRING) -> Iterator[bytes]:
    """The UTF-8 JSON text of `value` in parts, as `whole` (an encoder of these options) would make it at once:
    containers holding a large string walked (keys sorted with `sort_keys`, as the encoders sort unique keys), each
    large string's text made from its bytes `slice_chars` characters at a time (escaping never joins characters
    across a cut), everything else whole — a container with a key that is not a string too."""
    kind = type(value)
    if kind is str and len(value) > LARGE_STRING:
        yield b'"'
        for start in range(0, len(value), slice_chars):
            yield string_text(value[start:start + slice_chars], errors)
        yield b'"'
    elif kind is dict and carries_large_string(value) and all(type(key) is str for key in value):
        yield b"{"
        for index, key in enumerate(sorted(value) if sort_keys else value):
            yield (("," if index else "") + _escape(key) + ":").encode("utf-8", errors)
            yield from parts(value[key], whole, sort_keys=sort_keys, errors=errors, slice_chars=slice_chars)
        yield b"}"
    elif kind is list and carries_large_string(value):
        yield b"["
        for index, item in enumerate(value):
            if index:
                yield b","
            yield from parts(item, whole, sort_keys=sort_keys, errors=errors, slice_chars=slice_chars)
        yield b"]"
    else:
        yield whole(value)
