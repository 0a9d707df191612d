"""The gateway's own pages: one list answer cut into pages, and the cursor that brings the next one.

Owns the page size (setting `list_page_size`), the cursor format, and checking a cursor a client sends back, for
`tools/list`, `resources/list`, `resources/templates/list`, `prompts/list` and `tasks/list`. A list is made whole
for the client's principal, in its deterministic order (catalog.py, surfaces.py, tasks.py), and then cut: a
page holds up to `size` items from where the cursor says, and carries `nextCursor` when more follow. A list that
fits in one page is answered as it was made, with no work added. The pages of a list kept whole between requests
(jsonrpc.Encoded: `tools/list`, and the resources, templates and prompts lists) are kept with it, so that
each is cut and encoded once.

A cursor is opaque to clients: 28 bytes, base64url — where the next page starts, a digest of the identity (name,
URI, template or task id) of the last item the client was given, and an HMAC, under a key made at start, over
those, the client's name and the list method. One the gateway did not make for this client and this method
(another client's, a tampered or truncated one, one from before a restart of the daemon) is `-32602 Invalid
cursor`. A cursor stays meaningful across reloads and list changes: the next page starts right after the item it
names wherever that item is now, or at its position if that item is gone. So while nothing changes, paging
neither skips nor repeats an item; when something does, an item already given comes again only if the one the
cursor names and another before it both went away, and an item added before the cursor's place is not given
(the list_changed notification says to list again). Does not own making the lists.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct
from typing import Any

from gatewayd.errors import InvalidParams
from gatewayd.jsonrpc import Encoded

DEFAULT_PAGE_SIZE = 1000
# Each list method, the key of its items in the answer, and the key that names one item.
ITEMS = {
    "tools/list": ("tools", "name"),
    "resources/list": ("resources", "uri"),
    "resources/templates/list": ("resourceTemplates", "uriTemplate"),
    "prompts/list": ("prompts", "name"),
    "tasks/list": ("tasks", "taskId"),
}
# A cursor: the next page's first position, a digest of the last item's identity, an HMAC (truncated) over both.
_POSITION = struct.Struct(">I8s")
_LAYOUT = struct.Struct(">I8s16s")
_ENCODED_CHARS = len(base64.urlsafe_b64encode(bytes(_LAYOUT.size)).rstrip(b"="))
KEY_BYTES = 32
INVALID = "Invalid cursor: send back a nextCursor exactly as the gateway gave it for this list, or none for the " \
          "first page"


class Pager:
    """Cuts list answers into pages of `size` items; makes and checks the cursors between them."""

    def __init__(self, size: int = DEFAULT_PAGE_SIZE, key: bytes | None = None) -> None:
        if size < 1:
            raise ValueError("a page holds at least one item")
        self.size = size
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)

    def cursor(self, client: str, method: str, params: Any) -> tuple[int, bytes] | None:
        """Where the page a list request asks for starts (position, the last given item's digest); None: the first
        page. Raises InvalidParams for a cursor this gateway did not give `client` for `method`."""
        if not isinstance(params, dict) or params.get("cursor") is None:
            return None
        cursor = params["cursor"]
        if not isinstance(cursor, str) or len(cursor) != _ENCODED_CHARS:
            raise InvalidParams(INVALID)
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raise InvalidParams(INVALID) from None
        if len(raw) != _LAYOUT.size:
            raise InvalidParams(INVALID)
        start, last, mac = _LAYOUT.unpack(raw)
        if not hmac.compare_digest(mac, self._mac(client, method, start, last)):
            raise InvalidParams(INVALID)
        return start, last

    def page(self, client: str, method: str, answer: dict[str, Any], at: tuple[int, bytes] | None) -> dict[str, Any]:
        """The page of the whole list `answer` that starts where `at` (from `cursor`) says."""
        key, name = ITEMS[method]
        items = answer[key]
        if at is None and len(items) <= self.size:
            return answer
        start = 0 if at is None else _resume(items, name, *at)
        if isinstance(answer, Encoded):
            # The same page of the same list for the same client is the same bytes (the cursor's key is this pager's).
            return answer.derived(("page", client, method, start), (self, self.size),
                                  lambda: Encoded(self._cut(client, method, answer, start)))
        return self._cut(client, method, answer, start)

    def _cut(self, client: str, method: str, answer: dict[str, Any], start: int) -> dict[str, Any]:
        key, name = ITEMS[method]
        items = answer[key]
        end = start + self.size
        page = {**answer, key: items[start:end]}
        if end < len(items):
            last = _digest(items[end - 1][name])
            page["nextCursor"] = _encode(end, last, self._mac(client, method, end, last))
        return page

    def _mac(self, client: str, method: str, start: int, last: bytes) -> bytes:
        message = b"\0".join((client.encode(), method.encode(), _POSITION.pack(start, last)))
        return hmac.new(self._key, message, hashlib.sha256).digest()[:16]


def _digest(identity: Any) -> bytes:
    return hashlib.sha256(str(identity).encode("utf-8", "surrogatepass")).digest()[:8]


def _encode(start: int, last: bytes, mac: bytes) -> str:
    return base64.urlsafe_b64encode(_LAYOUT.pack(start, last, mac)).rstrip(b"=").decode()


def _resume(items: list[dict[str, Any]], name: str, start: int, last: bytes) -> int:
    """Where the next page starts: after the item the cursor names (at its old place if nothing changed, else
    wherever it is now), else at the cursor's position."""
    if 0 < start <= len(items) and _digest(items[start - 1][name]) == last:
        return start
    for index, item in enumerate(items):
        if _digest(item[name]) == last:
            return index + 1
    return min(start, len(items))
