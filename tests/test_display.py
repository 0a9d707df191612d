"""display.shown over every code point: which characters a person never sees raw, and that the escape is faithful JSON.

Also the helpers the per-channel tests use: `NASTY`, a string of what an agent might write to mislead an operator,
and `raw_unsafe`, what of a text would reach a person unescaped.
"""

from __future__ import annotations

import json
import sys
import unicodedata

from gatewayd.display import shown, shown_json

# Controls (C0, DEL, C1), format characters (bidi, zero-width, tags), line/paragraph separators, lone surrogates.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
# What an agent might write in arguments to mislead the person approving them; every character is one a request
# can carry (no lone surrogate: the HTTP parser refuses those).
NASTY = (
    "\x1b[2J\x1b]0;pwned\x07"  # clear the terminal, set its title
    "\u202egnp.exe"  # right-to-left override: reads as "exe.png"
    "\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d"  # isolates, embeddings, pop
    "\u200e\u200f\u061c"  # direction marks
    "\u200b\u2060\ufeff\u00ad"  # zero-width and invisible
    "\u2028\u2029"  # line and paragraph separators
    "\x7f\x85\x9b"  # DEL, C1 next line, C1 control sequence introducer
    "\U000e0041\U000e0042"  # invisible tag characters
)


def raw_unsafe(text: str, allow: str = "") -> list[str]:
    """The characters of `text` a person must not be shown raw (but those in `allow`, e.g. a line break)."""
    return [char for char in text if char not in allow and unicodedata.category(char) in UNSAFE_CATEGORIES]


def test_every_control_format_separator_and_surrogate_is_escaped_faithfully_and_nothing_else() -> None:
    changed_printable = []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        category = unicodedata.category(char)
        if category in UNSAFE_CATEGORIES:
            escaped = shown(char)
            assert escaped.isascii() and escaped.startswith("\\u"), (hex(code), escaped)
            # The escape is JSON's own: read back, it is the very character.
            assert json.loads(f'"{escaped}"') == char, hex(code)
        elif char.isprintable() and shown(char) != char:
            changed_printable.append(hex(code))
    assert changed_printable == []


def test_ordinary_text_passes_unchanged() -> None:
    for text in ("calc.add", "Grüße, 世界! 😀 👨‍", "a\u00a0b", "e\u0301", "C:\\path\\u202e", ""):
        # (A zero-width joiner is format: the family emoji would be shown as its parts, which is the point.)
        expected = text.replace("\u200d", "\\u200d")
        assert shown(text) == expected


def test_escapes_are_visible_and_exact() -> None:
    assert shown("\u202egnp.exe") == "\\u202egnp.exe"
    assert shown("a\x1b[31mb\n") == "a\\u001b[31mb\\u000a"
    assert shown("\U000e0041") == "\\udb40\\udc41"  # beyond the BMP: its surrogate pair, as JSON writes it
    assert shown("\ud800x") == "\\ud800x"  # a lone surrogate
    assert raw_unsafe(shown(NASTY)) == [] and len(raw_unsafe(NASTY)) == len(NASTY) - len("[2J]0;pwnedgnp.exe")


def test_a_json_value_is_shown_as_json_for_the_same_value() -> None:
    value = {NASTY: [NASTY, {"k\u202e": "\ud800 lone", "n": 1.5, "big": 10**30}], "plain": "line one\nline two"}
    for indent in (None, 2):
        text = shown_json(value, indent=indent)
        assert json.loads(text) == value
        assert raw_unsafe(text, allow="\n" if indent else "") == []
    assert shown_json(value, indent=2).count("\n") == json.dumps(value, indent=2).count("\n")
    assert shown_json("\u202e") == '"\\u202e"' and shown_json({"a": 1}) == '{"a": 1}'
