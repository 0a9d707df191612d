"""The 2026-07-28 ("modern", stateless) era of MCP, apart from HTTP: the per-request `_meta` envelope and what a
result carries in that era.

Owns: which versions are served per request, reading and checking a request's envelope (version, client
capabilities, client info, log level), the methods that era removed, which methods it serves at all, the
`server/discover` result, and finishing every result (`resultType`, the server's identity in `_meta`, `ttlMs` and
`cacheScope` on lists and reads). A modern request is an ordinary call without a session: authorization, policy,
limits, audit and confirmation are the pipeline's (gateway.py), as for a legacy one. Does not own HTTP headers,
status codes or streams (web/modern.py) or `subscriptions/listen` (listeners.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from gatewayd import request_state, surfaces
from gatewayd.errors import (
    GatewayError,
    InvalidParams,
    MethodNotFound,
    MissingClientCapability,
    UnsupportedProtocolVersion,
)
from gatewayd.jsonrpc import Encoded
from gatewayd.sessions import LOG_LEVELS

if TYPE_CHECKING:
    from gatewayd.continuations import Continuation

logger = logging.getLogger(__name__)

# Versions served per request, without a session (MCP 2026-07-28 basic/versioning.mdx), newest first.
MODERN_VERSIONS: Final = ("2026-07-28",)
VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
LOG_LEVEL_KEY: Final = "io.modelcontextprotocol/logLevel"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"

DISCOVER: Final = "server/discover"
LISTEN: Final = "subscriptions/listen"
# The tasks extension (SEP-2663, modern_tasks.py): declared per request under the client capabilities' `extensions`,
# advertised by `server/discover`; its methods, each about one task named by `params.taskId`.
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
TASK_METHODS: Final = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
# The methods 2026-07-28 removed from the core protocol (changelog.mdx): answered 404 + -32601 as unknown ones are.
# Tasks moved to an extension whose methods are TASK_METHODS: `tasks/result` and `tasks/list` are gone.
REMOVED: Final = frozenset({
    "initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe",
    "tasks/result", "tasks/list",
})
# MCP methods a modern request may name; anything else with a `/` is unknown. A dotted `server.method` is a plain
# JSON-RPC call to a tool server, decided by policy as in the legacy era.
SERVED: Final = frozenset({
    DISCOVER, LISTEN, "tools/list", "tools/call", *surfaces.LISTS, "resources/read", "prompts/get",
    "completion/complete", *TASK_METHODS,
})
# Results a client may cache (SEP-2549): every list, a resource's contents, and discovery.
CACHEABLE: Final = frozenset({DISCOVER, "tools/list", *surfaces.LISTS, "resources/read"})
# How long a client may reuse a cacheable result: not at all. Lists change with a reload, a child's notification or
# a policy edit at any moment, and listeners (`subscriptions/listen`) are told when they do.
CACHE_TTL_MS: Final = 0
# Every list and read depends on who asks (policy decides what each client sees): never shared between users.
CACHE_SCOPE: Final = "private"
# Kept of a client's declared capabilities and info: a few keys, a few levels, short strings (as sessions keep).
ENVELOPE_STRING: Final = 256
# The client capability each request a tool server may put to its caller needs.
ASKS: Final = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
# What a tool server is answered when its request cannot reach a modern caller (as the relay refuses, relay.py).
NOT_ASKED: Final = -32601
# The requests that may be answered with an input-required result, and retried with the answers (SEP-2322).
INPUT_METHODS: Final = frozenset({"tools/call", "prompts/get", "resources/read"})
INPUT_REQUIRED: Final = "input_required"
# The capabilities a caller may declare that a server's input requests need, by the requests' methods (ASKS).
ASKED_CAPABILITIES: Final = frozenset(ASKS.values())
# Input requests one result may carry, and keys of one retry's answers, at most: more is not a person's question.
MAX_INPUTS: Final = 32


@dataclass(frozen=True)
class Envelope:
    """What a modern request says about its client in `params._meta`."""

    version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]
    # The lowest level of `notifications/message` the client wants for this request; None: no log messages at all.
    log_level: str | None

    def declares(self, capability: str) -> bool:
        """Whether the client declared `capability` (an object) for this request."""
        return isinstance(self.capabilities.get(capability), dict)

    def declares_extension(self, extension: str) -> bool:
        """Whether the client declared the extension `extension` (an object under `extensions`) for this request."""
        extensions = self.capabilities.get("extensions")
        return isinstance(extensions, dict) and isinstance(extensions.get(extension), dict)

    def wants_log(self, level: Any) -> bool:
        """Whether a `notifications/message` at `level` reaches this request's caller."""
        if self.log_level is None:
            return False
        if level not in LOG_LEVELS:
            return True
        return LOG_LEVELS.index(level) >= LOG_LEVELS.index(self.log_level)


def meta_of(params: Any) -> Any:
    """A request's `_meta`, or None when there is none (or no params object to hold one)."""
    return params.get("_meta") if isinstance(params, dict) else None


def is_modern_body(params: Any) -> bool:
    """Whether a request's params carry the modern envelope's version key (the era is chosen per request)."""
    meta = meta_of(params)
    return isinstance(meta, dict) and VERSION_KEY in meta


def envelope(params: Any) -> Envelope:
    """The request's envelope, its shape checked: -32602 for a missing `_meta` or a missing or mistyped field. (Its
    version is checked after the headers, `check_version`: a client contradicting itself is told so first.)"""
    meta = meta_of(params)
    if not isinstance(meta, dict):
        raise InvalidParams(f"params._meta must be an object carrying {VERSION_KEY!r} and {CAPABILITIES_KEY!r}")
    missing = [key for key in (VERSION_KEY, CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise InvalidParams(f"params._meta lacks {', '.join(missing)}")
    version, capabilities = meta[VERSION_KEY], meta[CAPABILITIES_KEY]
    if not isinstance(version, str):
        raise InvalidParams(f"params._meta[{VERSION_KEY!r}] must be a string")
    if not isinstance(capabilities, dict):
        raise InvalidParams(f"params._meta[{CAPABILITIES_KEY!r}] must be an object")
    info = meta.get(CLIENT_INFO_KEY, {})
    if not isinstance(info, dict):
        raise InvalidParams(f"params._meta[{CLIENT_INFO_KEY!r}] must be an object")
    level = meta.get(LOG_LEVEL_KEY)
    if level is not None and level not in LOG_LEVELS:
        raise InvalidParams(f"params._meta[{LOG_LEVEL_KEY!r}] must be one of {', '.join(LOG_LEVELS)}")
    return Envelope(version, capabilities, info, level)


def check_version(envelope: Envelope) -> None:
    """-32022, naming the versions served, for a version not served per request."""
    if envelope.version not in MODERN_VERSIONS:
        raise UnsupportedProtocolVersion(envelope.version[:ENVELOPE_STRING], list(MODERN_VERSIONS))


def check_method(method: str) -> None:
    """-32601 for a method the modern era removed or never had (a dotted `server.method` goes to policy)."""
    if method in REMOVED or ("/" in method and method not in SERVED):
        raise MethodNotFound(method)


def discover_result(capabilities: dict[str, Any], instructions: str) -> dict[str, Any]:
    """`server/discover`: the versions served per request, what the gateway offers, how to read its names."""
    return {"supportedVersions": list(MODERN_VERSIONS), "capabilities": capabilities, "instructions": instructions}


def modern_capabilities(legacy: dict[str, Any]) -> dict[str, Any]:
    """The capabilities of the modern era: the legacy ones but tasks, which are an extension there."""
    capabilities = {name: value for name, value in legacy.items() if name != "tasks"}
    capabilities["extensions"] = {**capabilities.get("extensions", {}), TASKS_EXTENSION: {}}
    return capabilities


def finish(method: str, result: Any, server_info: dict[str, Any]) -> Any:
    """A result as the modern era carries it: `resultType`, the server's identity in `_meta`, and caching hints on
    what may be cached. A child's own `resultType` and `_meta` keys are kept. A result kept whole between requests
    (jsonrpc.Encoded) is finished once, and kept with it."""
    if isinstance(result, Encoded):
        return result.derived(("modern", method), server_info,
                              lambda: Encoded(_finished(method, result, server_info)))
    if not isinstance(result, dict):
        return result
    return _finished(method, result, server_info)


def _finished(method: str, result: dict[str, Any], server_info: dict[str, Any]) -> dict[str, Any]:
    finished = {**result}
    finished.setdefault("resultType", "complete")
    meta = finished.get("_meta")
    finished["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_KEY: server_info}
    if method in CACHEABLE:
        finished.setdefault("ttlMs", CACHE_TTL_MS)
        finished.setdefault("cacheScope", CACHE_SCOPE)
    return finished


@dataclass(frozen=True)
class GatewayState:
    """What the gateway itself asks a modern caller to send back (`requestState` of its own input-required result,
    sealed by web/modern.py): of what kind (request_state.APPROVAL) and what it says. A Python object, so that no
    tool server's result can pass for one."""

    kind: str
    data: dict[str, Any]


class InputRequired(GatewayError):
    """Raised by a step of the pipeline that needs the modern caller's input before the call can go on (the
    confirmation gate's question): answered as an input-required result, not an error (gateway.py)."""

    error_type = "input_required"

    def __init__(self, requests: dict[str, Any], state: GatewayState) -> None:
        super().__init__("input required")
        self.requests = requests
        self.state = state

    def caller_code(self) -> Any:
        # Not an error: the caller is answered with a result.
        return None

    def result(self) -> dict[str, Any]:
        return {"resultType": INPUT_REQUIRED, "inputRequests": self.requests, "requestState": self.state}


@dataclass(frozen=True)
class Retry:
    """A retry of an input-required result: the caller's answers, and what its `requestState` said (None: it sent
    none)."""

    answers: dict[str, Any]
    state: request_state.Opened | None


def answers_of(params: dict[str, Any]) -> dict[str, Any]:
    """A retry's `inputResponses`: an object of at most MAX_INPUTS answers; -32602 otherwise."""
    answers = params.get("inputResponses", {})
    if not isinstance(answers, dict):
        raise InvalidParams("params.inputResponses must be an object, keyed as the inputRequests it answers")
    if len(answers) > MAX_INPUTS:
        raise InvalidParams(f"params.inputResponses has more than {MAX_INPUTS} answers", {"limit": MAX_INPUTS})
    return answers


def check_asks(result: dict[str, Any], envelope: Envelope) -> None:
    """-32021 naming the capability when a tool server's input-required result asks what the caller did not declare
    (it was told what the caller declared, dialects.py; the caller could not answer)."""
    requests = result.get("inputRequests")
    if not isinstance(requests, dict):
        return
    for request in requests.values():
        method = request.get("method") if isinstance(request, dict) else None
        capability = ASKS.get(method) if isinstance(method, str) else None
        if capability is not None and not envelope.declares(capability):
            raise MissingClientCapability(capability)


class Asker:
    """Who a tool server's own requests (sampling, elicitation, roots) during a modern call are put to, and what the
    modern caller brings to a call: the capabilities it declared (a modern child is told them, dialects.py) and, on a
    retry, its answers. A legacy child's request needing a capability the caller did not declare fails the call with
    -32021 naming it (the server must not rely on it). A declared one becomes a question of the call's continuation
    (continuations.py: the caller is answered with an input-required result carrying it, and its retry brings the
    answer); a call run without one (a method that cannot be answered so) refuses it, as the relay refuses what it
    cannot ask."""

    def __init__(self, envelope: Envelope, retry: Retry | None = None) -> None:
        self.envelope = envelope
        self.retry = retry
        caps = envelope.capabilities
        self.capabilities = {kind: caps[kind] for kind in ASKED_CAPABILITIES if isinstance(caps.get(kind), dict)}
        # What a modern child is sent back: the answers, and its own state when the caller's state carried one.
        self.resume: dict[str, Any] | None = None
        if retry is not None and (retry.state is None or retry.state.kind == request_state.CHILD):
            self.resume = {"inputResponses": retry.answers}
            child = retry.state.data.get("s") if retry.state is not None else None
            if isinstance(child, str):
                self.resume["requestState"] = child
        # The continuation the call runs as, when a legacy child's questions can be put to the caller (web/modern.py).
        self.continuation: Continuation | None = None
        # The approval that let this call run (confirmation.py), carried in the state of a modern child's
        # input-required result (web/modern.py) so that the call's next round is not put to a person again.
        self.approved: str | None = None

    def carried(self) -> tuple[str, str] | None:
        """The approval (its id, and the state's one-use nonce) a retry's child state carries: the call was approved
        in an earlier round. None otherwise."""
        state = self.retry.state if self.retry is not None else None
        if state is None or state.kind != request_state.CHILD:
            return None
        approval, nonce = state.data.get("a"), state.data.get("n")
        return (approval, nonce) if isinstance(approval, str) and isinstance(nonce, str) else None

    def approval(self) -> str | None:
        """The approval a retry's state names (the confirmation gate asked), else None."""
        state = self.retry.state if self.retry is not None else None
        if state is None or state.kind != request_state.APPROVAL:
            return None
        approval = state.data.get("a")
        return approval if isinstance(approval, str) else None

    @property
    def log_level(self) -> str | None:
        """The level this request asked for (`io.modelcontextprotocol/logLevel`; none without it)."""
        return self.envelope.log_level

    def tell(self, status: str) -> None:
        """A child task's status: the continuation's, shown by the gateway's task of the call (modern_tasks.py)."""
        if self.continuation is not None:
            self.continuation.tell(status)

    @property
    def answers_input(self) -> bool:
        """A modern caller is answered a child's input-required result and retries with its answers itself."""
        return True

    def answer(self, key: str) -> Any:
        """The caller's answer under `key`, if its retry carries one."""
        return self.retry.answers.get(key) if self.retry is not None else None

    def declares(self, kind: str, params: Any) -> bool:
        """Whether the caller declared it can answer a request of `kind` (elicitation: in the mode asked)."""
        if not self.envelope.declares(kind):
            return False
        if kind != "elicitation":
            return True
        mode = params.get("mode", "form") if isinstance(params, dict) else "form"
        modes = self.envelope.capabilities["elicitation"]
        # An empty elicitation capability means form mode only (client/elicitation.mdx).
        return (mode == "form" and not modes) or isinstance(modes.get(mode), dict)

    def ask(self, server: str, allowed: Collection[str], message: dict[str, Any], call: asyncio.Future[Any] | None,
            reply: Callable[[dict[str, Any]], bool],
            withdrawn: asyncio.Future[Any] | None = None) -> dict[str, Any] | None:
        method = str(message.get("method"))
        capability = ASKS.get(method)
        if capability is not None and not self.envelope.declares(capability):
            if call is not None and not call.done():
                logger.info("server=%s %s: the modern caller did not declare %s", server, method, capability)
                call.set_exception(MissingClientCapability(capability))
        elif self.continuation is not None:
            return self.continuation.ask(server, allowed, message, self.declares, call, reply, withdrawn)
        return {"jsonrpc": "2.0", "id": message.get("id"),
                "error": {"code": NOT_ASKED, "message": f"{method}: not relayed to a client of MCP 2026-07-28 here"}}
