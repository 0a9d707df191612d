"""Text an agent wrote, made safe for a person to read: the one escaping every channel to a person uses.

Owns which characters are never shown raw — C0 and C1 controls and DEL (Cc: terminal escapes, line
breaks), format characters (Cf: bidi overrides, embeddings and isolates U+202A–U+202E and
U+2066–U+2069, the marks U+200E/U+200F/U+061C, zero-width characters, the invisible tag characters
U+E0000–U+E007F), the line and paragraph separators U+2028/U+2029 (Zl, Zp) and lone surrogates (Cs)
— and how they are shown instead: as visible JSON escapes (`\\u202e`; a character beyond the BMP as
its surrogate pair), so a JSON text stays JSON and means the same value. `shown(text)` is for a
string, `shown_json(value)` for any JSON value. Used by gatewayctl's tables, the approval view the
web page renders, and the elicitation message a caller's user reads. Does not own what is stored,
hashed or forwarded: those keep the agent's exact text. The audit log has its own, narrower escaping
(audit.py), for a file rather than a person.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Every character of Unicode categories Cc, Cf, Cs, Zl and Zp (Unicode 14, this Python's unicodedata; a later
# version's additions are listed too). tests/test_display.py checks the running Python's unicodedata is
# covered. A table, because deriving it at import walks 1.1 million code points (0.3 s for each gatewayctl run).
_RANGES = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E),
    (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF),
    (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
_UNSAFE = re.compile("[" + "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in _RANGES) + "]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code > 0xFFFF:
        # JSON escapes name UTF-16 units: a character beyond the BMP is two of them.
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def shown(text: str) -> str:
    """`text` with every control, format, separator and lone-surrogate character written as a visible `\\uXXXX`."""
    # Nearly every text is printable throughout (a C-speed check); only the others are searched.
    if text.isprintable():
        return text
    return _UNSAFE.sub(_escape, text)


def shown_json(value: Any, *, indent: int | None = None) -> str:
    """The JSON text of `value` for a person: valid JSON for the same value, nothing in it shown raw that `shown`
    escapes. With `indent`, its own line breaks are kept (the JSON text has no other: a string's are escaped)."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    if indent is None:
        return shown(text)
    return "\n".join(shown(line) for line in text.split("\n"))
