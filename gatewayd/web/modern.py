"""The `/mcp` endpoint for MCP 2026-07-28 ("modern") requests: stateless, one request per POST, no session.

Owns: telling a modern request from a legacy one (per request, basic/versioning.mdx), the validation ladder in the
spec's order (the `_meta` envelope's shape → the routing headers `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`,
`Mcp-Param-*` against the body → the version → the method), the HTTP status of each JSON-RPC error, answering as
JSON or as an event stream whose closing cancels the call, the request's log level, and the `subscriptions/listen`
stream. A modern call runs the same pipeline as a legacy one (`Gateway.dispatch`, with no session): the same
authorization, policy, limits, audit and confirmation. Does not own the envelope's meaning or results' decoration
(modern.py), the listeners' registry and filters (listeners.py), or legacy sessions (mcp_http.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import logging
import secrets
from typing import Any, Final

from aiohttp import web

from gatewayd import __version__, jsonrpc, jsontext, modern, modern_tasks, request_state
from gatewayd.calls import CallContext, Emit
from gatewayd.continuations import STATUS_TOKEN, Continuation
from gatewayd.errors import (
    GatewayError,
    HeaderMismatch,
    InvalidRequest,
    MissingClientCapability,
    RequestCancelled,
    error_response,
)
from gatewayd.listeners import (
    TASKS_NOTIFICATION,
    Listener,
    acknowledgement,
    requested,
    requested_tasks,
    subscribed_updates,
)
from gatewayd.policy import Principal
from gatewayd.sessions import SUPPORTED_VERSIONS
from gatewayd.state import DaemonState
from gatewayd.surfaces import SUBSCRIBE
from gatewayd.web import bodies, limits, sse

logger = logging.getLogger(__name__)

VERSION_HEADER: Final = "MCP-Protocol-Version"
METHOD_HEADER: Final = "Mcp-Method"
NAME_HEADER: Final = "Mcp-Name"
PARAM_PREFIX: Final = "Mcp-Param-"
SESSION_HEADER: Final = "Mcp-Session-Id"
# The body field each named method mirrors in `Mcp-Name` (transports/streamable-http.mdx).
NAMED: Final = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri",
                 **dict.fromkeys(modern.TASK_METHODS, "taskId")}
# The schema keyword that mirrors a tool argument in an `Mcp-Param-<token>` header (SEP-2243).
X_MCP_HEADER: Final = "x-mcp-header"
# A header value that is not plain ASCII travels as `=?base64?<base64 of its UTF-8>?=`.
B64_START, B64_END = "=?base64?", "?="
# HTTP status of each JSON-RPC error code in this era (streamable-http.mdx, basic/index.mdx); any other is 200.
STATUS: Final = {-32700: 400, -32600: 400, -32602: 400, -32020: 400, -32021: 400, -32022: 400, -32601: 404}
ROUTING_HEADERS: Final = (VERSION_HEADER, METHOD_HEADER, NAME_HEADER)
SERVER_INFO: Final = {"name": "gatewayd", "version": __version__}
# The one-use nonce a state carrying an approval holds (confirmation.py `_carry`): 96 bits, never guessed.
NONCE_BYTES: Final = 12


def chosen(request: web.Request, message: jsonrpc.Message) -> bool:
    """Whether a request is of the modern era: its `MCP-Protocol-Version` is not a legacy version, or it has no
    session and its `_meta` carries the modern envelope (a legacy client's header or session keeps it legacy)."""
    version = request.headers.get(VERSION_HEADER)
    if version is not None:
        return version not in SUPPORTED_VERSIONS
    return (SESSION_HEADER not in request.headers and isinstance(message, jsonrpc.Request)
            and message.method != "initialize" and modern.is_modern_body(message.params))


def _json(body: Any, status: int = 200) -> web.StreamResponse:
    return bodies.response(bodies.json_body(body), content_type="application/json", status=status)


def _error(request_id: Any, error: GatewayError) -> web.StreamResponse:
    return _json(error_response(request_id, error), STATUS.get(error.code, 200))


def _answered(answer: dict[str, Any]) -> web.StreamResponse:
    """A JSON answer, with the status its error code has in this era."""
    error = answer.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return _json(answer, STATUS.get(code, 200) if isinstance(code, int) else 200)


async def handle(request: web.Request, state: DaemonState, principal: Principal, body: jsonrpc.Body,
                 sse_ok: bool) -> web.StreamResponse:
    """Answer one modern POST."""
    if body.is_batch:
        return _error(None, InvalidRequest("MCP 2026-07-28 takes one message per POST, not a batch"))
    message = body.messages[0]
    if isinstance(message, jsonrpc.Invalid):
        return _error(message.id, message.error)
    if isinstance(message, jsonrpc.Response):
        return _error(message.id, InvalidRequest("MCP 2026-07-28 clients send no responses"))
    if isinstance(message, jsonrpc.Notification):
        # The core protocol defines no client notifications over HTTP (cancelling is closing the stream).
        return web.Response(status=202)
    try:
        envelope = modern.envelope(message.params)
        _check_headers(request, message, envelope)
        modern.check_version(envelope)
        modern.check_method(message.method)
        if message.method == modern.LISTEN:
            return await _listen(request, state, principal, message, envelope)
        if message.method == "tools/call":
            await _check_param_headers(request, state, principal, message)
            if isinstance(message.params, dict) and "task" in message.params:
                message = _without_task_param(message)
        retry, message = _retry(state, principal, message)
        resumed = _resumed(state, principal, retry)
        if resumed is not None:
            # A parked call's own context goes on; this request only waits for it (and may cancel it).
            assert retry is not None
            resumed.resume(retry.answers)
    except GatewayError as exc:
        logger.info("client=%s modern %s refused: %s", principal.name, message.method[:64], exc.message)
        return _error(message.id, exc)
    ctx = CallContext(principal, state.generation.servers, None, on_disconnect=limits.on_disconnect(request),
                      authority=state.principal, asker=modern.Asker(envelope, retry),
                      large=body.size > jsontext.LARGE_STRING,
                      tasks=envelope.declares_extension(modern.TASKS_EXTENSION))
    if sse_ok:
        return await _answer_sse(request, state, ctx, message, envelope, resumed)
    answer = await _cancellable(state, ctx, message, envelope, resumed)
    return _answered(answer)


# -- the ladder ------------------------------------------------------------------------------------


def _check_headers(request: web.Request, message: jsonrpc.Request, envelope: modern.Envelope) -> None:
    """-32020 when a routing header is missing, repeated, or says something else than the body."""
    headers = request.headers
    for name in ROUTING_HEADERS:
        if len(headers.getall(name, ())) > 1:
            raise HeaderMismatch(f"{name} header sent more than once")
    if headers.get(VERSION_HEADER) != envelope.version:
        raise HeaderMismatch(f"{VERSION_HEADER} header does not match params._meta[{modern.VERSION_KEY!r}]")
    if headers.get(METHOD_HEADER) != message.method:
        raise HeaderMismatch(f"{METHOD_HEADER} header does not match the method")
    field = NAMED.get(message.method)
    if field is not None and isinstance(message.params, dict):
        value = message.params.get(field)
        if value is not None and decoded(headers.get(NAME_HEADER)) != value:
            raise HeaderMismatch(f"{NAME_HEADER} header does not match params.{field}")


def decoded(value: str | None) -> str | None:
    """A header value as sent: the text of a `=?base64?…?=` value (None if that is malformed), else itself."""
    if value is None or not (value.startswith(B64_START) and value.endswith(B64_END)):
        return value
    try:
        return base64.b64decode(value[len(B64_START):-len(B64_END)], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


async def _check_param_headers(request: web.Request, state: DaemonState, principal: Principal,
                               message: jsonrpc.Request) -> None:
    """-32020 unless each argument the called tool marks `x-mcp-header` is mirrored, exactly, by its
    `Mcp-Param-<token>` header. Only a tool the client sees is looked at: of any other, nothing is told."""
    params = message.params if isinstance(message.params, dict) else {}
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str):
        return
    arguments = arguments if isinstance(arguments, dict) else {}
    marked = await state.gateway.catalog.marked_arguments(name, principal, state.generation.servers, X_MCP_HEADER)
    for argument, token in marked:
        if not isinstance(token, str):
            continue
        header = request.headers.get(PARAM_PREFIX + token)
        value = arguments.get(argument)
        if value is None and header is None:
            continue
        if value is None or header is None or decoded(header) != _rendered(value):
            raise HeaderMismatch(f"{PARAM_PREFIX}{token} header does not match arguments.{argument}")


def _rendered(value: Any) -> str | None:
    """An argument as its `Mcp-Param-*` header carries it: booleans as true/false, numbers and strings as text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return None


def _retry(state: DaemonState, principal: Principal, message: jsonrpc.Request) \
        -> tuple[modern.Retry | None, jsonrpc.Request]:
    """A retry of an input-required result (SEP-2322): its answers and its opened `requestState` (-32602 for one
    that is not this gateway's, altered, stale, or another client's or call's), and the request without them, as the
    pipeline decides it. Anything else is itself and None."""
    params = message.params
    if message.method not in modern.INPUT_METHODS or not isinstance(params, dict) \
            or request_state.RETRY_KEYS.isdisjoint(params.keys() - {"_meta"}):
        return None, message
    answers = modern.answers_of(params)
    opened = None
    if "requestState" in params:
        bound = request_state.binding(principal.name, message.method, params)
        opened = state.request_states.open(params["requestState"], bound)
    call = {key: value for key, value in params.items() if key not in ("inputResponses", "requestState")}
    return modern.Retry(answers, opened), jsonrpc.Request(message.id, message.method, call)


def _without_task_param(message: jsonrpc.Request) -> jsonrpc.Request:
    """A `tools/call` without the 2025-11-25 `task` member: in this era the server decides what becomes a task
    (SEP-2663), and a caller's old hint is passed over, not sent on to a child."""
    params = message.params if isinstance(message.params, dict) else {}
    return jsonrpc.Request(message.id, message.method, {key: value for key, value in params.items() if key != "task"})


def _resumed(state: DaemonState, principal: Principal, retry: modern.Retry | None) -> Continuation | None:
    """The parked call a retry's state names (taken: a state resumes its call once), else None."""
    if retry is None or retry.state is None or retry.state.kind != request_state.CONTINUATION:
        return None
    return state.continuations.take(retry.state.data.get("c"), principal.name)


def _sealed(state: DaemonState, ctx: CallContext, message: jsonrpc.Request, result: dict[str, Any]) -> dict[str, Any]:
    """An input-required result with the gateway's sealed `requestState`, bound to this client and call: the gate's
    own, or wrapping a tool server's (which goes back to that server on the retry, modern.Asker)."""
    said = result.get("requestState")
    if isinstance(said, modern.GatewayState):
        kind, data = said.kind, said.data
    else:
        kind, data = request_state.CHILD, _child_state(ctx, said)
    bound = request_state.binding(ctx.principal.name, message.method, message.params)
    return {**result, "requestState": state.request_states.seal(kind, bound, data)}


def _child_state(ctx: CallContext, said: Any) -> dict[str, Any]:
    """What the gateway keeps of a tool server's input-required result for its retry: the server's own state, and
    the approval that let the call run, if one did (its retry runs without asking again, once: confirmation.py
    `_carry`)."""
    data: dict[str, Any] = {"s": said} if isinstance(said, str) else {}
    approved = ctx.asker.approved if isinstance(ctx.asker, modern.Asker) else None
    if approved is not None:
        data.update(a=approved, n=secrets.token_urlsafe(NONCE_BYTES))
    return data


# -- answering -------------------------------------------------------------------------------------


def _log_filter(emit: Emit, envelope: modern.Envelope) -> Emit:
    """The call's event sink, without the log messages its `_meta` log level did not ask for (none without one)."""
    def filtered(message: dict[str, Any]) -> None:
        if message.get("method") == "notifications/message":
            params = message.get("params")
            if not envelope.wants_log(params.get("level") if isinstance(params, dict) else None):
                return
        emit(message)
    return filtered


async def _cancellable(state: DaemonState, ctx: CallContext, message: jsonrpc.Request,
                       envelope: modern.Envelope, resumed: Continuation | None = None) -> dict[str, Any]:
    """Answer the request; the caller closing its connection cancels the call (MCP 2026-07-28: closing the response
    stream is the cancellation). The call records itself as cancelled; the answer goes nowhere."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    def lost() -> None:
        nonlocal gone
        gone = True
        task.cancel()

    assert ctx.on_disconnect is not None
    forget = ctx.on_disconnect(lost)
    try:
        return await _dispatch(state, ctx, message, envelope, resumed)
    except asyncio.CancelledError:
        if not gone or task.uncancel() > 0:
            raise
        logger.info("client=%s closed the stream of %s: cancelled", ctx.principal.name, message.method[:64])
        return error_response(message.id, RequestCancelled("the client closed the response stream"))
    finally:
        forget()


async def _dispatch(state: DaemonState, ctx: CallContext, message: jsonrpc.Request,
                    envelope: modern.Envelope, resumed: Continuation | None = None) -> dict[str, Any]:
    """The answer, finished as the modern era carries results."""
    gateway = state.gateway
    if message.method == modern.DISCOVER:
        legacy = gateway.initialize_result(envelope.version)
        result: Any = modern.discover_result(modern.modern_capabilities(legacy["capabilities"]),
                                             legacy["instructions"])
        return jsonrpc.result_response(message.id, modern.finish(message.method, result, SERVER_INFO))
    if message.method in modern.TASK_METHODS:
        try:
            result = state.modern_tasks.answer(ctx.principal.name, message.method, message.params, envelope)
        except GatewayError as exc:
            return error_response(message.id, exc)
        return jsonrpc.result_response(message.id, modern.finish(message.method, result, SERVER_INFO))
    answer = await _run(state, ctx, message, resumed)
    if "result" in answer:
        result = answer["result"]
        if isinstance(result, dict) and result.get("resultType") == modern.INPUT_REQUIRED:
            try:
                modern.check_asks(result, envelope)
            except GatewayError as exc:
                logger.info("client=%s %s: %s", ctx.principal.name, message.method[:64], exc.message)
                return error_response(message.id, exc)
            result = _sealed(state, ctx, message, result)
        answer["result"] = modern.finish(message.method, result, SERVER_INFO)
    return answer


def _askable(ctx: CallContext, message: jsonrpc.Request, tasking: bool) -> modern.Asker | None:
    """The call's asker when it runs as a continuation: a method answerable with an input-required result, from a
    caller that declared something it can be asked (its tool server's questions can be put to it), or a call that
    may become a task (`tasking`). Any other call runs inline (a plain call pays for no continuation)."""
    asker = ctx.asker
    if isinstance(asker, modern.Asker) and message.method in modern.INPUT_METHODS and (asker.capabilities or tasking):
        return asker
    return None


async def _may_be_task(state: DaemonState, ctx: CallContext, message: jsonrpc.Request) -> bool:
    """Whether the call may become a task: a tool call, from a caller that declares the extension, of a tool whose
    tools.d `task` allows it (looked up as routing will find it; the pipeline decides the call itself)."""
    if message.method != "tools/call" or not isinstance(message.params, dict):
        return False
    name = message.params.get("name")
    if not isinstance(name, str):
        return False
    found = await state.gateway.catalog.find_tool(name, ctx.principal, ctx.servers)
    return found is not None and found[0].task_mode(found[1]) != "never"


async def _run(state: DaemonState, ctx: CallContext, message: jsonrpc.Request,
               resumed: Continuation | None) -> dict[str, Any]:
    """The call's answer, or an input-required result carrying its tool server's questions (continuations.py): the
    call then stays parked until the caller's retry (`resumed`) brings the answers."""
    continuation = resumed
    tasking = bool(ctx.tasks) and await _may_be_task(state, ctx, message)
    if continuation is None:
        asker = _askable(ctx, message, tasking)
        if asker is None:
            return await state.gateway.dispatch(ctx, message)
        if tasking:
            message = _with_status(message)
        # The call outlives this request: its events go where the current request says, its end is the
        # continuation's (this request's caller going away abandons it, `Continuation.wait`).
        continuation = _start(state, ctx, message, asker)
    continuation.attach(ctx.emit)
    task = None
    try:
        clock = asyncio.get_running_loop()
        inline_until = clock.time() + state.settings.task_after
        outcome = await continuation.wait(state.settings.task_after if tasking else None)
        while outcome is None:
            # A call still running past `task_after` becomes a task once it is decided (what it is, and whether its
            # caller may make it, is known only then): `wait` also returns when it is.
            left = inline_until - clock.time()
            if tasking and left <= 0 and continuation.call is not None:
                tasking = False
                task = _as_task(state, ctx, continuation, message)
                if task is not None:
                    return jsonrpc.result_response(message.id, {**task.view(),
                                                                "resultType": modern_tasks.RESULT_TYPE})
            outcome = await continuation.wait(left if tasking and left > 0 else None)
    except GatewayError as exc:
        return error_response(message.id, exc)
    finally:
        if task is None:
            continuation.detach()
        else:
            # A task's call goes on with nobody to tell its progress or log messages (SEP-2663: tasks carry none).
            continuation.attach(_nowhere)
    if isinstance(outcome, dict):
        return {**outcome, "id": message.id}
    try:
        state.continuations.park(continuation)
    except GatewayError as exc:
        logger.info("client=%s %s: %s", ctx.principal.name, message.method[:64], exc.message)
        return error_response(message.id, exc)
    requests = {question.key: question.input_request() for question in outcome}
    parked = modern.GatewayState(request_state.CONTINUATION, {"c": continuation.id})
    return jsonrpc.result_response(message.id, {"resultType": modern.INPUT_REQUIRED, "inputRequests": requests,
                                                "requestState": parked})


def _ask_again(state: DaemonState, ctx: CallContext, message: jsonrpc.Request, answers: dict[str, Any],
               said: Any) -> Continuation:
    """A task's next round after its modern tool server answered with questions (an input-required result): the
    call sent again with the caller's answers (`tasks/update`) and the server's own state, through the pipeline
    (decided, and audited, again), as a continuation of its own."""
    assert isinstance(ctx.asker, modern.Asker)
    retry = modern.Retry(answers, request_state.Opened(request_state.CHILD, _child_state(ctx, said)))
    continuation = _start(state, ctx, message, modern.Asker(ctx.asker.envelope, retry))
    continuation.attach(_nowhere)
    return continuation


def _with_status(message: jsonrpc.Request) -> jsonrpc.Request:
    """A call that may become a task, sent with a progress token of the gateway's if its caller gave none: what its
    tool server reports is then the task's `statusMessage` (continuations.py STATUS_TOKEN)."""
    params = message.params
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict) or "progressToken" in meta:
        return message
    return dataclasses.replace(message, params={**params, "_meta": {**meta, "progressToken": STATUS_TOKEN}})


def _start(state: DaemonState, ctx: CallContext, message: jsonrpc.Request, asker: modern.Asker) -> Continuation:
    """Run the call as a continuation owned by the daemon (continuations.py), not by the request that started it:
    its events and its tool server's questions go to the continuation, which learns how it was decided."""
    inner = dataclasses.replace(ctx, on_disconnect=None, asker=asker)
    continuation = state.continuations.start(ctx.principal.name, state.gateway.dispatch(inner, message))
    inner.emit = continuation.emit
    inner.on_decided = continuation.decided
    asker.continuation = continuation
    return continuation


def _as_task(state: DaemonState, ctx: CallContext, continuation: Continuation, message: jsonrpc.Request
             ) -> modern_tasks.Task | None:
    """The still running call made a task of its caller, when its tool may be one (tools.d `task`, as decided) and
    the caller has room for it; None otherwise (the call is answered when it ends)."""
    call = continuation.call
    if call is None or call.task_mode == "never":
        return None
    name, _, method = call.method.partition(".")
    server = ctx.servers.get(name)
    if server is None:
        return None
    # What a later round is sent with: the caller, not the request that made the task (it is answered now).
    caller = dataclasses.replace(ctx, emit=_nowhere, on_disconnect=None, on_decided=None)
    task = state.modern_tasks.create(ctx.principal.name, continuation, server.deadline_for(method), _finish_call,
                                     functools.partial(_ask_again, state, caller, message),
                                     functools.partial(_waiting, state, continuation))
    if task is not None:
        logger.info("client=%s %s runs on as task %s", ctx.principal.name, call.method[:64], task.id[:8])
    return task


def _waiting(state: DaemonState, continuation: Continuation) -> str | None:
    """What a task's call waits for that a person can act on: its confirmation, pending (None otherwise)."""
    call = continuation.call
    if call is None:
        return None
    client, digest = call.ctx.principal.name, call.params_sha256()
    for approval in state.approvals.pending():
        if approval.client == client and approval.method == call.method and approval.params_sha256 == digest:
            page = state.links.approval_page if state.settings.approval_page else None
            where = f" or at {page}" if page else ""
            return (f"waiting for a person's approval ({approval.id}): gatewayctl approve {approval.id}{where}")
    return None


def _finish_call(result: dict[str, Any]) -> dict[str, Any]:
    finished: dict[str, Any] = modern.finish("tools/call", result, SERVER_INFO)
    return finished


def _nowhere(_message: dict[str, Any]) -> None:
    return None


async def _answer_sse(request: web.Request, state: DaemonState, ctx: CallContext, message: jsonrpc.Request,
                      envelope: modern.Envelope, resumed: Continuation | None = None) -> web.StreamResponse:
    """Answer as an event stream once the call has something to say early (progress, logs) or runs long; an answer
    ready before that is plain JSON, so that an error keeps its HTTP status."""
    stream = sse.CallStream(request, {}, state.settings.sse_keepalive, state.deadlines, client=ctx.principal.name)
    ctx.emit = _log_filter(stream.emit, envelope)
    return await stream.answer(_cancellable(state, ctx, message, envelope, resumed), _answered)


# -- subscriptions/listen ---------------------------------------------------------------------------


async def _listen(request: web.Request, state: DaemonState, principal: Principal, message: jsonrpc.Request,
                  envelope: modern.Envelope) -> web.StreamResponse:
    """A `subscriptions/listen` stream: the acknowledgement, then the notifications its filter asked for that this
    client may see, until the client goes away or the daemon stops (then the listen result ends it)."""
    wanted, uris = requested(message.params)
    task_ids = requested_tasks(message.params)
    if task_ids:
        if not envelope.declares_extension(modern.TASKS_EXTENSION):
            raise MissingClientCapability(modern.TASKS_EXTENSION, extension=True)
        wanted.add(TASKS_NOTIFICATION)
    listener = state.listeners.open(principal.name, envelope, message.id, wanted)
    limits.give_back_slot(request)
    # A client that goes away frees its listener at once, not at the next keep-alive's write.
    forget = limits.on_disconnect(request)(functools.partial(state.listeners.close, listener))
    followed: list[str] = []
    try:
        subscribed = await _subscribe(state, principal, listener, uris, message)
        # Each task followed is told as it stands first (queued: written after the acknowledgement).
        followed = state.modern_tasks.watch(principal.name, task_ids, listener)
        response = web.StreamResponse(headers=sse.HEADERS)
        await response.prepare(request)
        await response.write(bodies.event(acknowledgement(listener, subscribed, followed)))
        ended = await _stream(response, listener, state.settings.sse_keepalive)
        if ended:
            result = modern.finish(modern.LISTEN, {"_meta": {modern.SUBSCRIPTION_ID_KEY: message.id}}, SERVER_INFO)
            await response.write(bodies.event(jsonrpc.result_response(message.id, result)))
        return response
    except ConnectionError:
        logger.debug("client=%s listen stream closed", principal.name)
        return web.Response(status=204)
    finally:
        forget()
        state.modern_tasks.unwatch(followed, listener)
        state.listeners.close(listener)


async def _subscribe(state: DaemonState, principal: Principal, listener: Listener, uris: list[str],
                     message: jsonrpc.Request) -> list[str]:
    """Subscribe the listener to each URI through the pipeline (decided as `resources/read` of its server, as a
    legacy subscription is); the URIs it got. One it may not read is left out as an unknown one is."""
    if not uris:
        return []
    ctx = CallContext(principal, state.generation.servers, listener, authority=state.principal)
    got: list[str] = []
    for uri in uris:
        subscribe = jsonrpc.Request(message.id, SUBSCRIBE, {"uri": uri})
        answer = await state.gateway.dispatch(ctx, subscribe)
        if "result" in answer:
            got.append(uri)
        else:
            logger.info("client=%s listen: %.200s not subscribed: %s", principal.name, uri, answer.get("error"))
    if got:
        subscribed_updates(listener)
    return got


async def _stream(response: web.StreamResponse, listener: Listener, keepalive: float) -> bool:
    """Write the listener's notifications as they come, with keep-alives; True when the daemon ended it."""
    while True:
        try:
            async with asyncio.timeout(keepalive):
                event = await listener.outbound.get()
        except TimeoutError:
            await response.write(sse.KEEPALIVE)
            continue
        if event is None:
            return True
        await response.write(bodies.event(event))

