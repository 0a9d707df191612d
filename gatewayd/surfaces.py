"""Resources, resource templates, prompts and completion: what each client may see of them, and who owns what.

Owns the MCP methods beside tools: the aggregated `resources/list`, `resources/templates/list` and
`prompts/list` (every server the client may use, in server-name order, each server's items sorted; the
child's own cursors are followed to the end, so the gateway answers in one page), the canonical names
policies grant them by, and which server a routed call goes to:

    SERVER.resources/read        list, read, subscribe and unsubscribe SERVER's resources and templates
    SERVER.prompts/get           list and get SERVER's prompts
    SERVER.completion/complete   complete arguments of SERVER's prompts (needs SERVER.prompts/get too) or
                                 resource templates (needs SERVER.resources/read too)

Prompts are named like tools (catalog.py: `<server><separator><prompt>`). Resource URIs are kept
verbatim; a URI belongs to the first server, in name order among those the client may read from, that
lists it; a URI listed by none belongs to the first such server one of whose templates matches it (RFC 6570,
by shape); anything else is unknown (`-32602 Unknown resource`) — no server is asked to guess, so a read
never reaches a server that did not say it has the URI. A URI two servers list is shown once, the first
server's, and the other's is left out with a warning. Whatever a client may not use does not exist for it:
not listed, and every direct route answers as for an unknown one.

Also who hears what a server says about them: `notifications/resources/updated` reaches the sessions that
subscribed to that URI of that server and may still read it; the list_changed notifications reach the
sessions that may use the server. Does not own the decision (policy.py), the pipeline (gateway.py) or
speaking to a child (upstream/).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from gatewayd import policy
from gatewayd.calls import Call, CallContext
from gatewayd.catalog import Catalog
from gatewayd.errors import GatewayError, InvalidParams, UnknownPrompt, UnknownReference, UnknownResource
from gatewayd.jsonrpc import Request
from gatewayd.policy import Decision, Principal
from gatewayd.sessions import Session, Sessions
from gatewayd.tokens import TokenTable
from gatewayd.upstream.api import Upstream

logger = logging.getLogger(__name__)

# The canonical method names (after `SERVER.`) policies grant.
READ = "resources/read"
GET = "prompts/get"
COMPLETE = "completion/complete"
SUBSCRIBE = "resources/subscribe"
UNSUBSCRIBE = "resources/unsubscribe"

# What a server lists (the Upstream `surface` kinds), the key of each item that names it, and the grant to see it.
RESOURCES = "resources"
TEMPLATES = "resourceTemplates"
PROMPTS = "prompts"
KEY = {RESOURCES: "uri", TEMPLATES: "uriTemplate", PROMPTS: "name"}
GRANT = {RESOURCES: READ, TEMPLATES: READ, PROMPTS: GET}
# The gateway's list methods and what each lists.
LISTS = {"resources/list": RESOURCES, "resources/templates/list": TEMPLATES, "prompts/list": PROMPTS}
# The routed methods (each a route of calls.py's kind) and the canonical method each is decided as.
ROUTES = {READ: READ, SUBSCRIBE: READ, UNSUBSCRIBE: READ, GET: GET, COMPLETE: COMPLETE}
METHODS = frozenset(LISTS) | frozenset(ROUTES)
# A longer URI or name is unknown at once.
MAX_URI_CHARS = 8192
# Subscriptions one session may hold.
MAX_SUBSCRIPTIONS = 1024

RESOURCES_CHANGED = "notifications/resources/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"


class Surfaces:
    """The resources, templates and prompts a principal may see, and the server each of its calls goes to."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        # Sessions subscribed to each (server, uri): a child is told to unsubscribe only when the last one does.
        self._subscribers: dict[tuple[str, str], int] = {}

    # -- subscriptions ---------------------------------------------------------------------

    def subscribed(self, session: Session, key: tuple[str, str]) -> None:
        """`session` holds a subscription to `key` (server, uri) now; forgotten when the session ends."""
        if key in session.subscriptions:
            return
        if not session.subscriptions:
            session.on_end(lambda: self._session_ended(session))
        session.subscriptions.add(key)
        self._subscribers[key] = self._subscribers.get(key, 0) + 1

    def shared(self, session: Session, key: tuple[str, str]) -> bool:
        """Whether another session than `session` also holds a subscription to `key`."""
        return self._subscribers.get(key, 0) - (1 if key in session.subscriptions else 0) > 0

    def unsubscribed(self, session: Session, key: tuple[str, str]) -> None:
        """`session` no longer holds a subscription to `key`."""
        if key in session.subscriptions:
            session.subscriptions.discard(key)
            self._count_down(key)

    def _session_ended(self, session: Session) -> None:
        for key in session.subscriptions:
            self._count_down(key)
        session.subscriptions.clear()

    def _count_down(self, key: tuple[str, str]) -> None:
        left = self._subscribers.get(key, 0) - 1
        if left > 0:
            self._subscribers[key] = left
        else:
            self._subscribers.pop(key, None)

    # -- lists -----------------------------------------------------------------------------

    async def list(self, principal: Principal, servers: Mapping[str, Upstream], method: str) -> dict[str, Any]:
        """The answer to one of the LISTS methods: every item of every server the principal may use."""
        kind = LISTS[method]
        visible = _usable(principal, servers, GRANT[kind])
        listed = await _gather(visible, kind)
        items: list[dict[str, Any]] = []
        owners: dict[str, str] = {}
        for server, result in zip(visible, listed, strict=True):
            for item in sorted(result, key=lambda item: str(item[KEY[kind]])):
                if kind == PROMPTS:
                    name = self.catalog.prompt_name(server.name, item["name"])
                    if name is None:
                        logger.warning("server=%s prompt %.100r has no name clients could send back; left out",
                                       server.name, item["name"])
                        continue
                    items.append({**item, "name": name})
                    continue
                key = item[KEY[kind]]
                first = owners.setdefault(key, server.name)
                if first != server.name:
                    logger.warning("server=%s also lists %.200r; %s's is kept, this one left out", server.name,
                                   key, first)
                    continue
                items.append(item)
        return {kind: items}

    # -- routing ---------------------------------------------------------------------------

    def call(self, ctx: CallContext, message: Request) -> Call:
        """The call a routed method makes: `name` is its URI, prompt name or reference; `arguments` are exactly
        what its server will be sent (a prompt's own name in place of the one clients see)."""
        method, params = message.method, message.params
        if not isinstance(params, dict):
            raise InvalidParams(f"{method} needs params")
        meta = params.get("_meta")
        sent = {key: value for key, value in params.items() if key != "_meta"}
        if method == GET:
            name = params.get("name")
            if not isinstance(name, str):
                raise InvalidParams("prompts/get needs params.name, a string")
            split = self.catalog.split_prompt(name)
            if split is not None:
                sent["name"] = split[1]
        elif method == COMPLETE:
            ref = params.get("ref")
            if not isinstance(ref, dict) or ref.get("type") not in ("ref/prompt", "ref/resource"):
                raise InvalidParams("completion/complete needs params.ref of type ref/prompt or ref/resource")
            key = "name" if ref["type"] == "ref/prompt" else "uri"
            name = ref.get(key)
            if not isinstance(name, str):
                raise InvalidParams(f"completion/complete needs params.ref.{key}, a string")
            split = self.catalog.split_prompt(name) if key == "name" else None
            if split is not None:
                sent["ref"] = {**ref, "name": split[1]}
        else:
            name = params.get("uri")
            if not isinstance(name, str):
                raise InvalidParams(f"{method} needs params.uri, a string")
        return Call(ctx, method, message.id, name, params, sent, meta)

    async def owner(self, call: Call) -> Upstream | None:
        """The server the call goes to, among those its client may use; None: unknown to this client."""
        if len(call.name) > MAX_URI_CHARS:
            return None
        principal, servers = call.ctx.principal, call.ctx.servers
        if call.route == GET:
            return await self._prompt_owner(principal, servers, call.name)
        if call.route == COMPLETE:
            ref = call.params["ref"]
            if ref["type"] == "ref/prompt":
                return await self._prompt_owner(principal, servers, call.name)
            return await self._template_owner(principal, servers, call.name)
        return await self.resource_owner(principal, servers, call.name)

    async def resource_owner(self, principal: Principal, servers: Mapping[str, Upstream], uri: str) -> Upstream | None:
        """The first server (name order) the principal may read from that lists `uri`, else the first one with a
        template matching it; None: unknown."""
        readable = _usable(principal, servers, READ)
        for server, resources in zip(readable, await _gather(readable, RESOURCES), strict=True):
            if any(item["uri"] == uri for item in resources):
                return server
        for server, templates in zip(readable, await _gather(readable, TEMPLATES), strict=True):
            if any(template_matches(item["uriTemplate"], uri) for item in templates):
                return server
        return None

    async def _template_owner(self, principal: Principal, servers: Mapping[str, Upstream], uri: str) -> Upstream | None:
        readable = _usable(principal, servers, READ)
        for server, templates in zip(readable, await _gather(readable, TEMPLATES), strict=True):
            if any(item["uriTemplate"] == uri for item in templates):
                return server
        return await self.resource_owner(principal, servers, uri)

    async def _prompt_owner(self, principal: Principal, servers: Mapping[str, Upstream], name: str) -> Upstream | None:
        split = self.catalog.split_prompt(name)
        server = servers.get(split[0]) if split is not None else None
        if server is None or split is None or not _may_use(principal, server.name, GET):
            return None
        [prompts] = await _gather([server], PROMPTS)
        return server if any(item["name"] == split[1] for item in prompts) else None


def canonical_method(route: str) -> str:
    """The method after `SERVER.` that a routed method is decided (and recorded) as."""
    return ROUTES[route]


def unknown(call: Call) -> GatewayError:
    """What a client is told for something it may not use, exactly as for something that does not exist."""
    if call.route == GET:
        return UnknownPrompt(call.name)
    if call.route == COMPLETE:
        return UnknownReference(call.name)
    return UnknownResource(call.name)


def _may_use(principal: Principal, server: str, grant: str) -> bool:
    return policy.may_call(principal, f"{server}.{grant}") is not Decision.DENY


def _usable(principal: Principal, servers: Mapping[str, Upstream], grant: str) -> list[Upstream]:
    """The servers, in name order, whose `grant` the principal has (by name: argument rules come at the call)."""
    return [servers[name] for name in sorted(servers) if _may_use(principal, name, grant)]


async def _gather(servers: list[Upstream], kind: str) -> list[list[dict[str, Any]]]:
    """Each server's list of `kind` (valid items only); a server that cannot say lists nothing, with a warning."""
    listed = await asyncio.gather(*(server.surface(kind) for server in servers), return_exceptions=True)
    out: list[list[dict[str, Any]]] = []
    for server, result in zip(servers, listed, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            logger.warning("server=%s %s left out: %s", server.name, kind, result)
            out.append([])
            continue
        out.append([item for item in result if isinstance(item, dict) and isinstance(item.get(KEY[kind]), str)])
    return out


# -- URI templates (RFC 6570), matched by shape --------------------------------------------------------

_EXPRESSION = re.compile(r"\{([+#./;?&]?)[^{}]*\}")


@lru_cache(maxsize=1024)
def _template_pattern(template: str) -> re.Pattern[str] | None:
    """A regex a URI expanded from `template` matches: simple expressions one path segment, `+`/`#` anything,
    query expressions an optional query. None for a template that is not one."""
    parts: list[str] = []
    last = 0
    for match in _EXPRESSION.finditer(template):
        parts.append(re.escape(template[last:match.start()]))
        operator = match.group(1)
        if operator in ("+", "#"):
            parts.append(".*")
        elif operator in ("?", "&"):
            parts.append(r"(?:[?&][^#]*)?")
        elif operator in (".", "/", ";"):
            parts.append(r"(?:" + re.escape(operator) + r"[^/?#]*)*")
        else:
            parts.append(r"[^/?#]+")
        last = match.end()
    rest = template[last:]
    if "{" in rest or "}" in rest:
        return None
    parts.append(re.escape(rest))
    return re.compile("".join(parts), re.DOTALL)


def template_matches(template: str, uri: str) -> bool:
    """Whether `uri` could be an expansion of the URI template `template`."""
    pattern = _template_pattern(template)
    return pattern is not None and pattern.fullmatch(uri) is not None


# -- what sessions hear ----------------------------------------------------------------------------------

def tell(sessions: Sessions, tokens: TokenTable, server: str, message: dict[str, Any]) -> None:
    """A server's notification about its resources or prompts, passed on to the sessions it concerns."""
    method = message.get("method")

    def may(client: str, grant: str) -> bool:
        principal = tokens.principal(client)
        return principal is not None and _may_use(principal, server, grant)

    if method == UPDATED:
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            return
        sessions.broadcast({"jsonrpc": "2.0", "method": UPDATED, "params": params},
                           to=lambda session: (server, uri) in session.subscriptions and may(session.client, READ))
    elif method in (RESOURCES_CHANGED, PROMPTS_CHANGED):
        grant = READ if method == RESOURCES_CHANGED else GET
        logger.info("server=%s %s; notifying sessions", server, method)
        sessions.broadcast({"jsonrpc": "2.0", "method": method}, to=lambda session: may(session.client, grant))

