"""The `/mcp` endpoint: JSON-RPC 2.0 over HTTP and MCP Streamable HTTP (POST, GET, DELETE, SSE).

Owns: request framing (Content-Type, Accept), the one parse of the body, handing a request of MCP 2026-07-28
to web/modern.py (the era is chosen per request), legacy MCP session rules
(minting on `initialize`, 400 without a session id, 404 for an unknown one, the
MCP-Protocol-Version header), choosing a JSON or SSE answer (SSE itself: sse.py), and the
GET stream. Each request reads the daemon's config generation once, when it begins (tokens,
servers), and keeps it to its end. Does not own routing or policy (gateway.py) or tokens
(tokens.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from aiohttp import web

from gatewayd import jsonrpc, jsontext
from gatewayd.calls import CallContext
from gatewayd.errors import GatewayError, HttpError, InvalidRequest
from gatewayd.gateway import Gateway
from gatewayd.jsonrpc import Invalid, Notification, Request, Response
from gatewayd.policy import Principal
from gatewayd.resumable import SESSION_STREAM, Cut, Replay
from gatewayd.sessions import SUPPORTED_VERSIONS, Session
from gatewayd.state import DaemonState
from gatewayd.web import bodies, limits, modern, sse
from gatewayd.web.keys import STATE

logger = logging.getLogger(__name__)

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
# A reconnecting client names the last event it got (resumable.py).
LAST_EVENT_ID = "Last-Event-ID"
# Distinct Accept headers whose parse is remembered.
ACCEPT_CACHE = 64
# Bodies up to this size are parsed on the event loop (well under a millisecond); larger ones in a worker thread.
PARSE_INLINE_BYTES = 64 * 1024
# MCP's own methods need a session; `server.method` direct calls do not.
SESSION_METHODS = frozenset({"ping", "tools/list", "tools/call", "logging/setLevel", "resources/list",
                             "resources/templates/list", "resources/read", "resources/subscribe",
                             "resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete"})


def _state(request: web.Request) -> DaemonState:
    return request.app[STATE]


def _accepts(request: web.Request) -> tuple[bool, bool]:
    """(accepts JSON, accepts SSE) from the Accept header; no header accepts JSON."""
    return _parse_accept(request.headers.get("Accept", ""))


# A client sends the same Accept header on every request: parse each distinct one once (bounded).
@functools.lru_cache(maxsize=ACCEPT_CACHE)
def _parse_accept(accept: str) -> tuple[bool, bool]:
    if not accept:
        return True, False
    parts = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    json_ok = bool(parts & {"application/json", "application/*", "*/*"})
    return json_ok, "text/event-stream" in parts


def _check_version_header(request: web.Request) -> None:
    """A legacy request's version header names a legacy version (any other makes a request modern, modern.py)."""
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version not in SUPPORTED_VERSIONS:
        supported = ", ".join(SUPPORTED_VERSIONS)
        raise HttpError(400, f"unsupported {VERSION_HEADER}: {version[:40]!r}; supported: {supported}")


def _session_for(request: web.Request, principal: Principal, *, required: bool) -> Session | None:
    """The request's session: 400 if required and absent, 404 if unknown, ended or someone else's."""
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is None:
        if required:
            raise HttpError(400, f"missing {SESSION_HEADER} header: send initialize first")
        return None
    session = _state(request).sessions.get(session_id, principal.name)
    if session is None:
        raise HttpError(404, "unknown or ended session: initialize again")
    _check_version_header(request)
    return session


def _json(body: Any, status: int = 200, session: Session | None = None) -> web.StreamResponse:
    headers = {SESSION_HEADER: session.id} if session is not None else None
    return bodies.response(bodies.json_body(body), content_type="application/json", status=status, headers=headers)


def _body_error(error: GatewayError) -> web.StreamResponse:
    return _json(jsonrpc.error_response(None, error), status=400)


async def handle_post(request: web.Request) -> web.StreamResponse:
    """POST /mcp: one message or a batch."""
    state = _state(request)
    generation = state.generation
    principal = generation.tokens.authenticate(request.headers.get("Authorization"))
    limits.authenticated(request)
    if request.content_type != "application/json":
        raise HttpError(415, "Content-Type must be application/json")
    json_ok, sse_ok = _accepts(request)
    if not (json_ok or sse_ok):
        raise HttpError(406, "Accept must allow application/json or text/event-stream")
    declared = request.content_length
    if declared is not None and declared > state.settings.max_body_bytes:
        raise HttpError(413, f"body larger than {state.settings.max_body_bytes} bytes")
    if declared is not None:
        limits.admit_body(request, principal, declared)
    content = request.content
    # A body with a declared length that is in whole already (a small POST, the usual case) is taken as it lies,
    # without aiohttp's read loop (~100 bytecodes a call); its length was checked against max_body_bytes above.
    data = content.read_nowait() if declared is not None and content.is_eof() else await request.read()
    if declared is None:
        limits.admit_body(request, principal, len(data))
    try:
        body = await _parse(state, data)
    except GatewayError as exc:
        logger.info("client=%s body refused: %s", principal.name, exc.message)
        return _body_error(exc)
    limits.admit_post(request, principal, body.messages)
    if modern.chosen(request, body.messages[0]):
        # MCP 2026-07-28: stateless, chosen per request (web/modern.py).
        return await modern.handle(request, state, principal, body, sse_ok)
    if not body.is_batch and isinstance(body.messages[0], Request) and body.messages[0].method == "initialize":
        return _initialize(state, principal, body.messages[0], sse_ok)
    needs_session = any(_needs_session(message) for message in body.messages)
    session = _session_for(request, principal, required=needs_session)
    ctx = CallContext(principal, generation.servers, session, on_disconnect=limits.on_disconnect(request),
                      authority=state.principal, large=body.size > jsontext.LARGE_STRING)
    requests = await _take_non_requests(state.gateway, ctx, body.messages)
    if not requests:
        return web.Response(status=202)
    if not body.is_batch and sse_ok:
        return await _answer_streamable(request, state, ctx, requests[0], json_ok)
    if not body.is_batch:
        return _json(await _answer(state.gateway, ctx, requests[0]), session=session)
    responses = await asyncio.gather(*(_answer(state.gateway, ctx, message) for message in requests))
    return _json(responses, session=session)


async def _parse(state: DaemonState, data: bytes) -> jsonrpc.Body:
    """The one parse of a body: small ones here, large ones one at a time in a worker thread, so that parsing
    megabytes (a Python hook runs per object) does not hold the event loop, and everyone else's calls, for its
    whole length."""
    settings = state.settings
    if len(data) <= PARSE_INLINE_BYTES:
        return jsonrpc.parse_body(data, max_depth=settings.max_json_depth, max_batch=settings.max_batch,
                                  max_objects=settings.max_json_objects)
    async with state.big_parses:
        return await asyncio.to_thread(jsonrpc.parse_body, data, max_depth=settings.max_json_depth,
                                       max_batch=settings.max_batch, max_objects=settings.max_json_objects)


def _needs_session(message: jsonrpc.Message) -> bool:
    if isinstance(message, Request | Notification):
        return message.method in SESSION_METHODS or message.method.startswith("notifications/")
    return isinstance(message, Response)


async def _take_non_requests(
    gateway: Gateway, ctx: CallContext, messages: list[jsonrpc.Message]
) -> list[Request | Invalid]:
    """Handle notifications and client responses (no answer); return what needs an answer, in order."""
    answerable: list[Request | Invalid] = []
    for message in messages:
        if isinstance(message, Notification):
            await gateway.notify(ctx, message)
        elif isinstance(message, Response):
            gateway.answer(ctx, message)
        else:
            answerable.append(message)
    return answerable


async def _answer(gateway: Gateway, ctx: CallContext, message: Request | Invalid) -> dict[str, Any]:
    if isinstance(message, Invalid):
        return jsonrpc.error_response(message.id, message.error)
    if message.method == "initialize":
        return jsonrpc.error_response(message.id, InvalidRequest("initialize must be sent alone, not in a batch"))
    return await gateway.dispatch(ctx, message)


def _initialize(state: DaemonState, principal: Principal, message: Request, sse_ok: bool) -> web.StreamResponse:
    params = message.params if isinstance(message.params, dict) else {}
    session = state.sessions.create(principal.name, params)
    answer = jsonrpc.result_response(message.id, state.gateway.initialize_result(session.protocol_version))
    if sse_ok:
        return sse.whole(answer, {SESSION_HEADER: session.id})
    return _json(answer, session=session)


# -- SSE -----------------------------------------------------------------------------------


async def _answer_streamable(
    request: web.Request, state: DaemonState, ctx: CallContext, message: Request | Invalid, json_ok: bool
) -> web.StreamResponse:
    """Answer one call as SSE once it has something to say before its response (progress, logs, a request relayed
    to the client) or runs past the first keep-alive: those events, keep-alives, then the response. An answer ready
    before that goes as plain JSON when the client accepts it (MCP lets the server choose; every client must read
    both): the smaller form for both sides, as the 2026-07-28 path answers too."""
    headers = {SESSION_HEADER: ctx.session.id} if ctx.session is not None else {}
    stream = sse.CallStream(request, headers, state.settings.sse_keepalive, state.deadlines,
                            client=ctx.principal.name, replays=ctx.session.replays if ctx.session else None,
                            poll_after=state.settings.sse_poll_after)
    ctx.emit = stream.emit
    plain = functools.partial(_json, session=ctx.session) if json_ok else None
    return await stream.answer(_answer(state.gateway, ctx, message), plain)


async def handle_get(request: web.Request) -> web.StreamResponse:
    """GET /mcp: the session's server-to-client stream (tools/list_changed and the like)."""
    state = _state(request)
    principal = state.generation.tokens.authenticate(request.headers.get("Authorization"))
    limits.authenticated(request)
    _, sse_ok = _accepts(request)
    if not sse_ok:
        raise HttpError(406, "Accept must allow text/event-stream")
    session = _session_for(request, principal, required=True)
    assert session is not None
    resumed = session.replays.find(request.headers.get(LAST_EVENT_ID))
    if resumed is not None:
        return await _resume(request, session, *resumed, state.settings.sse_keepalive)
    return await _session_stream(request, session, state.settings.sse_keepalive)


async def _session_stream(request: web.Request, session: Session, keepalive: float) -> web.StreamResponse:
    """The session's own stream on this connection (taken over from an older one when the client names an event of
    it): what came after that event, then what the session hears, until the session ends, this connection closes or
    a newer one takes over (resumable.SessionStream)."""
    own = session.stream
    after = own.after(request.headers.get(LAST_EVENT_ID))
    cut = functools.partial(sse.abort, request)
    if not own.take(after, cut):
        raise HttpError(409, "this session already has an open GET stream")
    forget = limits.on_disconnect(request)(functools.partial(own.let_go, cut))
    response = web.StreamResponse(headers={**sse.HEADERS, SESSION_HEADER: session.id})
    try:
        await response.prepare(request)
        if after is not None:
            _taken_up(session, SESSION_STREAM, own.missed(after))
        await response.write(own.opening(after))
        await _stream_session(response, session, cut, keepalive)
    except ConnectionError:
        logger.debug("client=%s GET stream closed", session.client)
    finally:
        forget()
        own.let_go(cut)
    return response


async def _resume(request: web.Request, session: Session, replay: Replay, after: int,
                  keepalive: float) -> web.StreamResponse:
    """A GET with the `Last-Event-ID` of one of the session's call streams: taken over from the connection that read
    it (which the client lost), every event of it after that one, the rest as it comes, its answer last; then this
    response ends (resumable.py)."""
    cut = functools.partial(sse.abort, request)
    replay.take_over(cut)
    _taken_up(session, replay.id, replay.missed(after))
    response = web.StreamResponse(headers={**sse.HEADERS, SESSION_HEADER: session.id})
    try:
        await response.prepare(request)
        if await replay.send(response.write, after, keepalive, sse.KEEPALIVE, cut):
            session.replays.delivered(replay)
    except ConnectionError:
        logger.debug("client=%s resumed stream %s closed again", session.client, replay.id)
    finally:
        replay.let_go(cut)
    return response


def _taken_up(session: Session, stream: str, missed: int) -> None:
    """A reconnection named an event of `stream` older than what is kept: say how many it will not get."""
    if missed:
        logger.warning("client=%s stream %s taken up again: %d event(s) it missed are no longer kept",
                       session.client, stream, missed)


async def _stream_session(response: web.StreamResponse, session: Session, cut: Cut, keepalive: float) -> None:
    """What the session hears, numbered, as it comes, with keep-alives; while `cut`'s connection reads the stream."""
    own, queue = session.stream, session.outbound
    while own.cut is cut:
        events: list[bytes] = []
        ended = False
        while not queue.empty():
            message = queue.get_nowait()
            if message is None:
                ended = True
                break
            events.append(own.framed(bodies.event(message)))
        if events:
            await response.write(b"".join(events))
        if ended:
            return
        if not events and not await own.wait(keepalive):
            await response.write(sse.KEEPALIVE)


async def handle_delete(request: web.Request) -> web.Response:
    """DELETE /mcp: end the session; its id answers 404 from now on."""
    state = _state(request)
    principal = state.generation.tokens.authenticate(request.headers.get("Authorization"))
    limits.authenticated(request)
    session = _session_for(request, principal, required=True)
    assert session is not None
    state.sessions.delete(session.id)
    return web.Response(status=204)
