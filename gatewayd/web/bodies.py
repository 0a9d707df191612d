"""HTTP bodies of JSON-RPC answers: one bytes object for nearly all, written out in slices for a large string.

Encoding an answer the plain way holds a large tool result several times over at once: the parsed value, its
escaped JSON text, the answer's joined text, its UTF-8 bytes, and for an SSE event those bytes again inside the
event's framing. An answer that carries a string longer than jsontext.LARGE_STRING near its top (a tool's text, a
resource's blob: where large results put it) is instead written as it is encoded, that string LARGE_SLICE
characters at a time, each slice escaped and encoded just before it is written and the writer draining between
them: the value and a slice, however large the result. Owns that choice and the writing; does not own the parts'
text (jsontext.py), what an answer says (jsonrpc.py) or the SSE stream of a call (sse.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from aiohttp import payload, web
from aiohttp.abc import AbstractStreamWriter

from gatewayd import jsonrpc, jsontext
from gatewayd.web import aiohttp_hooks

# Characters of a large string (jsontext.LARGE_STRING) escaped, encoded and handed to the writer at a time.
LARGE_SLICE: Final = 256 * 1024
SSE_HEAD: Final = b"event: message\ndata: "
SSE_TAIL: Final = b"\n\n"


def event(message: dict[str, Any]) -> bytes:
    """One SSE event carrying one JSON-RPC message on a single `data:` line (a notification, a small answer)."""
    return SSE_HEAD + jsonrpc.dumps(message) + SSE_TAIL


def json_body(message: Any) -> bytes | payload.Payload:
    """An answer as the body of an `application/json` response."""
    if not jsontext.carries_large_string(message):
        return jsonrpc.dumps(message)
    return _Streamed(message, b"", b"")


def response(body: bytes | payload.Payload, *, content_type: str, status: int = 200,
             headers: dict[str, str] | None = None) -> web.StreamResponse:
    """The HTTP response carrying an answer's body: bytes in one write (aiohttp_hooks.WholeResponse), a streamed
    body through aiohttp's own."""
    if type(body) is bytes:
        return aiohttp_hooks.WholeResponse(body, status=status, content_type=content_type, headers=headers)
    return web.Response(body=body, status=status, content_type=content_type, headers=headers)


def sse_body(message: dict[str, Any]) -> bytes | payload.Payload:
    """An answer as one SSE event, the body of a stream that carries nothing else."""
    if not jsontext.carries_large_string(message):
        return event(message)
    return _Streamed(message, SSE_HEAD, SSE_TAIL)


async def write_event(response: web.StreamResponse, message: dict[str, Any], head: bytes = b"") -> None:
    """Write one SSE event carrying `message` on an open stream, in slices if it carries a large string; `head`
    before it (its `id:` line, resumable.py)."""
    if not jsontext.carries_large_string(message):
        await response.write(head + event(message))
        return
    await response.write(head + SSE_HEAD)
    for part in _encoded(message):
        await response.write(part)
    await response.write(SSE_TAIL)


def _encoded(value: Any) -> Iterator[bytes]:
    """The UTF-8 JSON text of `value`, in parts of at most about LARGE_SLICE bytes, each made as it is taken."""
    pending: list[bytes] = []
    size = 0
    for part in _parts(value):
        pending.append(part)
        size += len(part)
        if size >= LARGE_SLICE:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def _parts(value: Any) -> Iterator[bytes]:
    """The UTF-8 JSON text of `value` in pieces, large strings a slice at a time (as jsonrpc.dumps would write it: NaN
    and Infinity raise ValueError)."""
    return jsontext.parts(value, jsonrpc.dumps, slice_chars=LARGE_SLICE)


class _Streamed(payload.Payload):
    """An answer carrying a large string, encoded as it is written, sent chunked (its length is known only once it
    is encoded). Written once: it lets go of the answer then, as the connection keeps its last response until the
    next request on it comes (aiohttp), and a large result must not stay that long."""

    def __init__(self, message: Any, head: bytes, tail: bytes) -> None:
        super().__init__(None)
        self._message: Any = message
        self._head, self._tail = head, tail

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        if self._message is None:
            raise RuntimeError("the answer was written already")
        return (self._head + jsonrpc.dumps(self._message) + self._tail).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        message, self._message = self._message, None
        if message is None:
            raise RuntimeError("the answer was written already")
        if self._head:
            await writer.write(self._head)
        for part in _encoded(message):
            await writer.write(part)
        if self._tail:
            await writer.write(self._tail)
