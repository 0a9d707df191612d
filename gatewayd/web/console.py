"""The web approval page for operators: a live list of pending confirmations with approve/deny.

Owns the page (one static, self-contained HTML document with its inline CSS and JS, served under a
strict Content-Security-Policy; its style, script and body are package files in assets/), its JSON
API (`/approvals/api/...`: the pending list, the live event stream, approve and deny) and ending
those streams when the daemon stops. Every API route needs an operator token (`Authorization:
Bearer`); agents' tokens are refused by TokenTable.operator.
The page holds no data itself, so loading it needs no token; the browser keeps the token in
sessionStorage and reads the stream with fetch(), since EventSource cannot send a header.
Does not own the approvals themselves (approvals.py), tokens (tokens.py), the answer's status
(answers.py), or Host/Origin checks and turning HttpError into a response (app.py).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from aiohttp import web

from gatewayd import approvals, jsonrpc, urls
from gatewayd.errors import HttpError
from gatewayd.web import answers, limits, sse
from gatewayd.web.keys import STATE

logger = logging.getLogger(__name__)

PAGE_PATH = urls.APPROVALS_PATH
API_PATH = f"{PAGE_PATH}/api"
# The API as the page's script names it: relative to the page (the page is one segment at the root, so
# "approvals/api" from /approvals is API_PATH), so that under a proxy's path prefix /gw/approvals calls
# /gw/approvals/api.
PAGE_API = API_PATH.removeprefix("/")

# What the page offers for "allow the same call again without asking": (seconds, label); 0 asks every time.
ALLOW_AGAIN_CHOICES = [(0, "no, ask every time"), (600, "for 10 minutes"), (3600, "for 1 hour")]
# {"reason": <500 characters>} fits in this many times over; a bigger body is not a decision.
MAX_DECISION_BODY_BYTES = 8192
# Each open page holds a watcher queue; a handful of operators needs a few, a runaway script must not hold more.
MAX_STREAMS = 64
# A page that cannot take a few kilobytes in this long is gone or stuck; stop holding its watcher.
WRITE_TIMEOUT = 10.0
# What a refused stream (too many pages, or stopping) is told to wait before trying again.
RETRY_AFTER_S = 5

SNAPSHOT = "snapshot"
CHANGE = "change"


# -- the page --------------------------------------------------------------------------------------------

# The page's style, script and body are package files (gatewayd/web/assets/), read once, when the page is first
# asked for (an idle daemon does not hold them). Each is served inline after a newline that opens its element
# (`<style>`, `<body>`, `<script>`); the CSP hashes cover exactly that text.
_ASSETS = files("gatewayd.web") / "assets"


def _asset(name: str) -> str:
    return "\n" + (_ASSETS / name).read_text(encoding="utf-8")


def _csp_hash(code: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii") + "'"


@functools.cache
def page() -> tuple[bytes, dict[str, str]]:
    """The page and the headers it is served with (its Content-Security-Policy allows exactly its own script and
    style), made once."""
    style = _asset("approvals.css")
    # The script's placeholders are filled in before its hash is taken.
    script = (_asset("approvals.js").replace("__API__", PAGE_API)
              .replace("__MAX_REASON__", str(approvals.MAX_REASON_CHARS))
              .replace("__AGAIN_CHOICES__", json.dumps(ALLOW_AGAIN_CHOICES)))
    body = _asset("approvals.html")
    html = (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>Approvals — gatewayd</title>\n"
        f"<style>{style}</style>\n</head>\n<body>{body}<script>{script}</script>\n</body>\n</html>\n"
    ).encode()
    csp = (f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(style)}; "
           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, {"Content-Security-Policy": csp, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                  "Referrer-Policy": "no-referrer"}
_API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


# -- open streams, so shutdown can end them ----------------------------------------------------------------


@dataclass
class _Streams:
    """The watcher queues of the open live streams, and whether the daemon is stopping."""

    queues: set[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=set)
    stopping: bool = False

    def watch(self, registry: approvals.Approvals) -> asyncio.Queue[dict[str, Any] | None]:
        queue = registry.watch()
        self.queues.add(queue)
        return queue

    def unwatch(self, registry: approvals.Approvals, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        registry.unwatch(queue)
        self.queues.discard(queue)

    def stop(self) -> None:
        """Wake every stream so it sees `stopping` and ends."""
        self.stopping = True
        for queue in self.queues:
            queue.put_nowait(None)


STREAMS = web.AppKey("console_streams", _Streams)


def add_routes(app: web.Application) -> None:
    """Register the page and its API on `app`, and end the live streams when it shuts down."""
    app[STREAMS] = _Streams()
    app.on_shutdown.append(_end_streams)
    app.router.add_get(PAGE_PATH, _page)
    app.router.add_get(f"{API_PATH}/pending", _pending)
    app.router.add_get(f"{API_PATH}/stream", _stream)
    app.router.add_post(API_PATH + "/{approval_id}/approve", _approve)
    app.router.add_post(API_PATH + "/{approval_id}/deny", _deny)


async def _end_streams(app: web.Application) -> None:
    """aiohttp waits for running handlers on shutdown: an open page must not hold the daemon up."""
    app[STREAMS].stop()


# -- handlers ---------------------------------------------------------------------------------------------


async def _page(request: web.Request) -> web.Response:
    """The page: static and without data, so no token is needed to load it."""
    html, headers = page()
    return web.Response(body=html, content_type="text/html", charset="utf-8", headers=headers)


def _operator(request: web.Request) -> str:
    """The operator's name, or HttpError(401) (no token, a wrong one, or an agent's)."""
    name = request.app[STATE].generation.tokens.operator(request.headers.get("Authorization"))
    limits.authenticated(request)
    return name


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=jsonrpc.dumps(body), status=status, content_type="application/json",
                        headers=_API_HEADERS)


def _views(registry: approvals.Approvals) -> list[dict[str, Any]]:
    return [approval.view() for approval in registry.pending()]


async def _pending(request: web.Request) -> web.Response:
    """GET .../pending: the pending approvals, oldest first."""
    _operator(request)
    return _json({"approvals": _views(request.app[STATE].approvals)})


async def _approve(request: web.Request) -> web.Response:
    """POST .../{id}/approve."""
    return await _decide(request, approve=True)


async def _deny(request: web.Request) -> web.Response:
    """POST .../{id}/deny."""
    return await _decide(request, approve=False)


async def _decide(request: web.Request, *, approve: bool) -> web.Response:
    """Answer one approval (the status: answers.reported)."""
    state = request.app[STATE]
    name = _operator(request)
    reason, again = _answer(await _read_body(request), approve)
    approval_id = request.match_info["approval_id"]
    answer = state.approvals.decide(
        approval_id, approve=approve, by=f"operator {name} (web page)", channel=approvals.WEB, reason=reason,
        allow_again_for=again,
    )
    _log_answer(name, approve, approval_id, answer)
    status, body = answers.reported(answer)
    return _json(body, status=status)


def _log_answer(name: str, approve: bool, approval_id: str, answer: approvals.Answer) -> None:
    verb = "approved" if approve else "denied"
    if answer.ok and answer.approval is not None:
        found = answer.approval
        logger.info("operator %s %s approval %s on the web page: client=%s method=%s%s", name, verb, found.id,
                    found.client, found.method, f" reason={found.reason!r}" if found.reason else "")
    else:
        logger.info("operator %s: web answer (%s) to approval %.40r changed nothing: %s", name, verb, approval_id,
                    answer.message)


async def _read_body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_DECISION_BODY_BYTES:
        raise HttpError(413, f"body larger than {MAX_DECISION_BODY_BYTES} bytes")
    data = await request.read()
    if len(data) > MAX_DECISION_BODY_BYTES:
        raise HttpError(413, f"body larger than {MAX_DECISION_BODY_BYTES} bytes")
    return data


def _answer(data: bytes, approve: bool) -> tuple[str | None, float | None]:
    """The optional reason and "allow again" seconds from a body `{"reason": "...", "allow_again_for": 600}`
    (or none); HttpError(400) for anything else."""
    try:
        return approvals.parse_answer(json.loads(data) if data.strip() else None, approve=approve)
    except RecursionError:
        raise HttpError(400, 'the body must be JSON: {"reason": "..."}, or empty') from None
    except ValueError as exc:  # json's own errors are ValueErrors too, and say where the JSON broke
        raise HttpError(400, str(exc)) from None


# -- the live stream --------------------------------------------------------------------------------------


def _event(name: str, payload: dict[str, Any]) -> bytes:
    """One SSE event: its name, and its payload as single-line JSON."""
    return b"event: " + name.encode("ascii") + b"\ndata: " + jsonrpc.dumps(payload) + b"\n\n"


async def _write(response: web.StreamResponse, data: bytes) -> None:
    async with asyncio.timeout(WRITE_TIMEOUT):
        await response.write(data)


async def _stream(request: web.Request) -> web.StreamResponse:
    """GET .../stream: `snapshot` (the whole list), then a `change` per change, keep-alive comments between;
    a fresh `snapshot` if this reader fell behind. Ends when the reader goes or the daemon stops."""
    state = request.app[STATE]
    name = _operator(request)
    streams = request.app[STREAMS]
    if streams.stopping:
        raise HttpError(503, "gatewayd is stopping", {"Retry-After": str(RETRY_AFTER_S)})
    if len(streams.queues) >= MAX_STREAMS:
        raise HttpError(503, f"{MAX_STREAMS} approval pages are open already; close one",
                        {"Retry-After": str(RETRY_AFTER_S)})
    response = web.StreamResponse(headers={**sse.HEADERS, **_API_HEADERS})
    await response.prepare(request)
    logger.debug("operator %s opened the approval stream", name)
    try:
        await _feed(response, state.approvals, streams, state.settings.sse_keepalive)
    except (ConnectionError, TimeoutError):
        logger.debug("operator %s: approval stream closed or too slow", name)
    return response


async def _feed(
    response: web.StreamResponse, registry: approvals.Approvals, streams: _Streams, keepalive: float
) -> None:
    """Write the list, then its changes, until the daemon stops. Watching starts before the list is read, so
    no change is missed; one may arrive twice, which the page takes in its stride."""
    queue = streams.watch(registry)
    try:
        await _write(response, _snapshot(registry, keepalive))
        while not streams.stopping:
            try:
                async with asyncio.timeout(keepalive):
                    change = await queue.get()
            except TimeoutError:
                await _write(response, sse.KEEPALIVE)
                continue
            if streams.stopping:
                return
            if change is None:
                # Too far behind: Approvals dropped this queue. Watch afresh, then send the whole list again.
                streams.unwatch(registry, queue)
                queue = streams.watch(registry)
                await _write(response, _snapshot(registry, keepalive))
            else:
                await _write(response, _event(CHANGE, change))
    finally:
        streams.unwatch(registry, queue)


def _snapshot(registry: approvals.Approvals, keepalive: float) -> bytes:
    # keepalive_s lets the page notice a silently dead connection (no byte for a few periods).
    return _event(SNAPSHOT, {"approvals": _views(registry), "keepalive_s": keepalive})
