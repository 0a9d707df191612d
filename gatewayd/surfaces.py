"""Resources, resource templates, prompts and completion: what each client may see of them, and who owns what.

Owns the MCP methods beside tools: the aggregated `resources/list`, `resources/templates/list` and `prompts/list`
(every server the client may use, in server-name order, each server's items sorted; the child's own cursors are
followed to the end, and the gateway pages the whole list itself, paging.py), the canonical names policies grant
them by, and which server a routed call goes to:

    SERVER.resources/read        list, read, subscribe and unsubscribe SERVER's resources and templates
    SERVER.prompts/get           list and get SERVER's prompts
    SERVER.completion/complete   complete arguments of SERVER's prompts (needs SERVER.prompts/get too) or
                                 resource templates (needs SERVER.resources/read too)

Prompts are named like tools (catalog.py: `<prefix><separator><prompt>`, the prompt's own name for a server
whose `prefix = ""`; two servers giving one name: the first in listing order has it, for the list, `prompts/get`
and `completion/complete` alike). Resource URIs are kept
verbatim; a URI belongs to the first server, in name order among those the client may read from, that
lists it; a URI listed by none belongs to the first such server one of whose templates matches it (RFC 6570,
by shape); anything else is unknown (`-32602 Unknown resource`) — no server is asked to guess, so a read
never reaches a server that did not say it has the URI. A URI two servers list is shown once, the first
server's, and the other's is left out with a warning. Whatever a client may not use does not exist for it:
not listed, and every direct route answers as for an unknown one.

Also who hears what a server says about them: `notifications/resources/updated` reaches the sessions that subscribed
to that URI of that server and may still read it; the list_changed notifications reach the sessions that may use the
server. And the subscriptions sessions hold at the children: each new child of a server is subscribed again to the
URIs sessions whose clients may still read them hold, and the child is told to unsubscribe when the last session
holding a URI lets go of it (unsubscribe, DELETE, expiry). Does not own the decision (policy.py), the pipeline
(gateway.py) or speaking to a child (upstream/).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final

from gatewayd import policy
from gatewayd.calls import Call, CallContext
from gatewayd.catalog import Catalog, listing_order
from gatewayd.errors import GatewayError, InvalidParams, UnknownPrompt, UnknownReference, UnknownResource
from gatewayd.jsonrpc import Encoded, ReadOnlyList, Request
from gatewayd.policy import Decision, Principal
from gatewayd.sessions import Session, Sessions
from gatewayd.tokens import TokenTable
from gatewayd.upstream.api import Delivery, Upstream

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
# Servers' lists whose valid items are kept made (`_valid`); all are let go at once past this many.
MAX_KEPT_LISTS = 1024
# (principal, grant) whose usable servers are kept made (`Surfaces._usable`); all let go at once past this many.
MAX_KEPT_USABLE = 1024
# (principal, list method) whose last answer is kept (`Surfaces.list`); all let go at once past this many.
MAX_KEPT_ANSWERS = 1024

# Whose share of a server's slots the gateway's own subscription calls take.
SUBSCRIPTIONS = Delivery("gatewayd:subscriptions")
# Each kept list, by id, with its valid items (`_valid`).
_VALID: dict[int, tuple[list[Any], _Listed]] = {}

RESOURCES_CHANGED = "notifications/resources/list_changed"
PROMPTS_CHANGED = "notifications/prompts/list_changed"
UPDATED = "notifications/resources/updated"


# Who a client is in the config generation current now (None: removed by a reload).
Principals = Callable[[str], Principal | None]
# The tool servers of the config generation current now.
Servers = Callable[[], Mapping[str, Upstream]]


class Surfaces:
    """The resources, templates and prompts a principal may see, the server each of its calls goes to, and the
    subscriptions sessions hold at the servers' children."""

    def __init__(self, catalog: Catalog, principals: Principals | None = None, servers: Servers | None = None) -> None:
        self.catalog = catalog
        # Who may still read (a re-subscription is for them only), and the current servers (an unsubscription goes
        # there); without them (tests of the lists alone) subscriptions are neither renewed nor ended at the child.
        self._principals = principals
        self._servers = servers
        # The sessions (id → client) subscribed to each (server, uri): a child is told to unsubscribe only when the
        # last one lets go, and a new child is told again of every URI still held.
        self._holders: dict[tuple[str, str], dict[str, str]] = {}
        # Re-subscriptions and unsubscriptions on their way to children; `close` ends them.
        self._sending: set[asyncio.Task[None]] = set()
        # The servers each principal may use for a grant (`_usable`), for one server table at a time: a reload's
        # new table lets the old one (and its servers) go.
        self._usable_of: Mapping[str, Upstream] | None = None
        self._usable_memo: dict[tuple[int, str], tuple[Principal, Usable]] = {}
        # Each principal's last answer to each list method, with what it was made from (`list`), for the server
        # table `_usable_of` only.
        self._answers: dict[tuple[int, str], tuple[Principal, Mapping[str, Upstream], tuple[int, ...], list[_Listed],
                                                   Encoded]] = {}

    # -- subscriptions ---------------------------------------------------------------------

    def subscribed(self, session: Session, key: tuple[str, str]) -> None:
        """`session` holds a subscription to `key` (server, uri) now; forgotten when the session ends."""
        if key in session.subscriptions:
            return
        if not session.subscriptions:
            session.on_end(lambda: self._session_ended(session))
        session.subscriptions.add(key)
        self._holders.setdefault(key, {})[session.id] = session.client

    def shared(self, session: Session, key: tuple[str, str]) -> bool:
        """Whether another session than `session` also holds a subscription to `key`."""
        holders = self._holders.get(key, {})
        return len(holders) - (1 if session.id in holders else 0) > 0

    def unsubscribed(self, session: Session, key: tuple[str, str]) -> None:
        """`session` no longer holds a subscription to `key`."""
        if key in session.subscriptions:
            session.subscriptions.discard(key)
            self._let_go(session, key)

    def _session_ended(self, session: Session) -> None:
        """A session ended (DELETE, expiry): the URIs nobody holds any more are unsubscribed at their children."""
        released: dict[str, list[str]] = {}
        for key in session.subscriptions:
            if self._let_go(session, key):
                released.setdefault(key[0], []).append(key[1])
        session.subscriptions.clear()
        for server, uris in sorted(released.items()):
            self._send(self._unsubscribe(server, uris), f"{server}-unsubscribe")

    def _let_go(self, session: Session, key: tuple[str, str]) -> bool:
        """Forget `session`'s hold on `key`; whether it was the last."""
        holders = self._holders.get(key)
        if holders is None:
            return False
        holders.pop(session.id, None)
        if holders:
            return False
        del self._holders[key]
        return True

    def child_up(self, server: Upstream) -> None:
        """A new child of `server` runs (after a crash, an idle stop, a restart, a reload): it is subscribed again
        to every URI of the server that a session whose client may still read it holds."""
        if self._principals is None:
            return
        uris = [uri for (name, uri), holders in self._holders.items()
                if name == server.name and any(self._may_read(client, name) for client in set(holders.values()))]
        if uris:
            self._send(self._resubscribe(server, uris), f"{server.name}-resubscribe")

    def holds(self, server: str) -> bool:
        """Whether a session whose client may still read `server` holds a subscription at it: its child must run for
        them to hear of changes (upstream/server.py keeps it, and starts it again after it exits)."""
        if self._principals is None:
            return False
        return any(name == server and any(self._may_read(client, name) for client in set(holders.values()))
                   for (name, _uri), holders in self._holders.items())

    def _may_read(self, client: str, server: str) -> bool:
        principal = self._principals(client) if self._principals is not None else None
        return principal is not None and _may_use(principal, server, READ)

    def _send(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _resubscribe(self, server: Upstream, uris: list[str]) -> None:
        logger.info("server=%s new child: subscribing it again to %d URIs sessions hold", server.name, len(uris))
        for uri in uris:
            if (server.name, uri) in self._holders:
                await _tell_child(server, SUBSCRIBE, uri)

    async def _unsubscribe(self, server_name: str, uris: list[str]) -> None:
        server = self._servers().get(server_name) if self._servers is not None else None
        # A child that is not running holds no subscription; starting one only to unsubscribe would be waste.
        if server is None or getattr(server, "pid", None) is None:
            return
        for uri in uris:
            # Held again meanwhile (a new session subscribed): the child keeps it.
            if (server_name, uri) not in self._holders:
                await _tell_child(server, UNSUBSCRIBE, uri)

    async def close(self) -> None:
        """Stop the re-subscriptions and unsubscriptions still on their way (the daemon is stopping)."""
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)

    # -- lists -----------------------------------------------------------------------------

    async def list(self, principal: Principal, servers: Mapping[str, Upstream], method: str) -> Encoded:
        """The answer to one of the LISTS methods: every item of every server the principal may use. Made again only
        when the principal, the server table or one of the lists changed (a kept list stays the same object until
        the child says it changed): until then the same answer, its JSON text made once, and its warnings (an item
        two servers list) logged once, not on every call (20 servers listing the same 100 URIs: 27 ms and 1,900
        warnings a `resources/list`)."""
        kind = LISTS[method]
        usable = self._usable(principal, servers, GRANT[kind])
        visible = sorted(usable, key=listing_order) if kind == PROMPTS else usable
        listed = await _gather(visible, kind)
        made = tuple(map(id, listed))
        kept = self._answers.get((id(principal), method))
        if kept is not None and kept[0] is principal and kept[1] is servers and kept[2] == made:
            return kept[4]
        answer = Encoded({kind: ReadOnlyList(_items(self.catalog, kind, visible, listed))})
        if len(self._answers) >= MAX_KEPT_ANSWERS:
            self._answers.clear()
        # The lists are kept with the answer, so that their ids cannot be another list's meanwhile. A server that
        # could not list gives a new empty list each time: its answer is made again, as its warning is.
        self._answers[(id(principal), method)] = (principal, servers, made, listed, answer)
        return answer

    # -- routing ---------------------------------------------------------------------------

    def call(self, ctx: CallContext, message: Request) -> Call:
        """The call a routed method makes: `name` is its URI, prompt name or reference; `arguments` are exactly
        what its server will be sent (`owner` puts a prompt's own name in place of the one clients see)."""
        method, params = message.method, message.params
        if not isinstance(params, dict):
            raise InvalidParams(f"{method} needs params")
        meta = params.get("_meta")
        sent = {key: value for key, value in params.items() if key != "_meta"}
        if method == GET:
            name = params.get("name")
            if not isinstance(name, str):
                raise InvalidParams("prompts/get needs params.name, a string")
        elif method == COMPLETE:
            ref = params.get("ref")
            if not isinstance(ref, dict) or ref.get("type") not in ("ref/prompt", "ref/resource"):
                raise InvalidParams("completion/complete needs params.ref of type ref/prompt or ref/resource")
            key = "name" if ref["type"] == "ref/prompt" else "uri"
            name = ref.get(key)
            if not isinstance(name, str):
                raise InvalidParams(f"completion/complete needs params.ref.{key}, a string")
        else:
            name = params.get("uri")
            if not isinstance(name, str):
                raise InvalidParams(f"{method} needs params.uri, a string")
        return Call(ctx, method, message.id, name, params, sent, meta)

    async def owner(self, call: Call) -> Upstream | None:
        """The server the call goes to, among those its client may use; None: unknown to this client. A prompt's
        call is sent (and its rules see) the server's own name of the prompt."""
        if len(call.name) > MAX_URI_CHARS:
            return None
        principal, servers = call.ctx.principal, call.ctx.servers
        if call.route == COMPLETE and call.params["ref"]["type"] == "ref/resource":
            return await self._template_owner(principal, servers, call.name)
        if call.route not in (GET, COMPLETE):
            return await self.resource_owner(principal, servers, call.name)
        found = await self._prompt_owner(principal, servers, call.name)
        if found is None:
            return None
        server, own = found
        if call.route == GET:
            call.arguments = {**call.arguments, "name": own}
        else:
            call.arguments = {**call.arguments, "ref": {**call.arguments["ref"], "name": own}}
        return server

    async def resource_owner(self, principal: Principal, servers: Mapping[str, Upstream], uri: str) -> Upstream | None:
        """The first server (name order) the principal may read from that lists `uri`, else the first one with a
        template matching it; None: unknown."""
        readable = self._usable(principal, servers, READ)
        owner = await _first_having(readable, RESOURCES, lambda listed: uri in listed.named)
        if owner is not None:
            return owner
        return await _first_having(readable, TEMPLATES, lambda listed: listed.matches(uri))

    async def _template_owner(self, principal: Principal, servers: Mapping[str, Upstream], uri: str) -> Upstream | None:
        readable = self._usable(principal, servers, READ)
        owner = await _first_having(readable, TEMPLATES, lambda listed: uri in listed.named)
        return owner if owner is not None else await self.resource_owner(principal, servers, uri)

    def _usable(self, principal: Principal, servers: Mapping[str, Upstream], grant: str) -> Usable:
        """The servers, in name order, whose `grant` the principal has (by name: argument rules come at the call),
        made once per principal and server table: deciding it takes 3–6 µs a server, on every `resources/read`.
        Read, never changed."""
        if servers is not self._usable_of:
            # A reload's new table: what was made for the old one (and its servers) is let go.
            self._usable_memo.clear()
            self._answers.clear()
            self._usable_of = servers
        elif len(self._usable_memo) >= MAX_KEPT_USABLE:
            self._usable_memo.clear()
        key = (id(principal), grant)
        kept = self._usable_memo.get(key)
        # Kept with its principal, so that the id cannot be another's meanwhile.
        if kept is not None and kept[0] is principal:
            return kept[1]
        usable = Usable([servers[name] for name in sorted(servers) if _may_use(principal, name, grant)])
        self._usable_memo[key] = (principal, usable)
        return usable

    async def _prompt_owner(self, principal: Principal, servers: Mapping[str, Upstream],
                            name: str) -> tuple[Upstream, str] | None:
        """(server, its own name of the prompt) for a prompt name as `list` shows it to this principal. Every server
        without a prefix may have it: each is passed over by its name and its known list (deciding whether the
        client may use it, and a coroutine to take its list, cost ~5.6 µs a server passed)."""
        usable = self._usable(principal, servers, GET).names
        for server, own in self.catalog.prompt_candidates(name, servers):
            if server.name not in usable:
                continue
            prompts = _known(server, PROMPTS)
            if prompts is None:
                [prompts] = await _gather([server], PROMPTS)
            if own in prompts.named:
                return server, own
        return None


def _items(catalog: Catalog, kind: str, visible: list[Upstream], listed: list[_Listed]) -> list[dict[str, Any]]:
    """The items of a list answer: each server's sorted, a key another server listed first left out."""
    items: list[dict[str, Any]] = []
    owners: dict[str, str] = {}
    for server, result in zip(visible, listed, strict=True):
        for item in sorted(result, key=lambda item: str(item[KEY[kind]])):
            key = item[KEY[kind]]
            if kind == PROMPTS:
                key = catalog.prompt_name(server.prefix, key)
                if key is None:
                    logger.warning("server=%s prompt %.100r has no name clients could send back; left out",
                                   server.name, item["name"])
                    continue
            first = owners.setdefault(key, server.name)
            if first != server.name:
                logger.warning("server=%s also lists %.200r; %s's is kept, this one left out", server.name,
                               key, first)
                continue
            items.append({**item, "name": key} if kind == PROMPTS else item)
    return items


async def _tell_child(server: Upstream, method: str, uri: str) -> None:
    """Send the child `resources/subscribe` or `resources/unsubscribe` of `uri` for the gateway itself (not a
    client's call: nothing to decide or audit); a failure is logged, the rest go on."""
    try:
        await server.call_surface(method, {"uri": uri}, SUBSCRIPTIONS)
    except Exception as exc:  # one URI the child refuses must not stop the others
        logger.warning("server=%s %s %.200r failed: %s", server.name, method, uri, exc)


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


class Usable(list[Upstream]):
    """The servers a principal may use for a grant, in name order, and their names (`Surfaces._usable`)."""

    __slots__ = ("names",)

    def __init__(self, servers: list[Upstream]) -> None:
        super().__init__(servers)
        self.names = frozenset(server.name for server in servers)


class _Listed(list[dict[str, Any]]):
    """A server's valid items of one kind, with their keys (URIs, names) to look one up by rather than compare each;
    for a list of templates, their shapes (`matches`)."""

    __slots__ = ("named", "_shapes")

    def __init__(self, items: list[dict[str, Any]], key: str) -> None:
        super().__init__(items)
        self.named = frozenset(item[key] for item in items)
        self._shapes: _Shapes | None = None

    def matches(self, uri: str) -> bool:
        """Whether `uri` could be an expansion of one of these templates (made at the first read that asks)."""
        shapes = self._shapes
        if shapes is None:
            shapes = self._shapes = _Shapes(self.named)
        return shapes.match(uri)


async def _gather(servers: list[Upstream], kind: str) -> list[_Listed]:
    """Each server's list of `kind` (valid items only); a server that cannot say lists nothing, with a warning.
    Lists known without waiting are taken as they are: only the others are asked, together (a task each)."""
    known = [_known(server, kind) for server in servers]
    asking = [server for server, listed in zip(servers, known, strict=True) if listed is None]
    answers = iter(await asyncio.gather(*(server.surface(kind) for server in asking), return_exceptions=True)
                   if asking else ())
    out: list[_Listed] = []
    for server, listed in zip(servers, known, strict=True):
        if listed is None:
            result = next(answers)
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                logger.warning("server=%s %s left out: %s", server.name, kind, result)
                listed = _Listed([], KEY[kind])  # a new one each time: an answer made of it is made again
            else:
                listed = _valid(result, kind)
        out.append(listed)
    return out


async def _first_having(servers: list[Upstream], kind: str, has: Callable[[_Listed], bool]) -> Upstream | None:
    """The first of `servers` whose list of `kind` `has` what is looked for. Known lists are looked at in order, and
    the search ends at the first that has it; from the first list not known, the rest are asked together, as
    `_gather` asks."""
    for at, server in enumerate(servers):
        known = _known(server, kind)
        if known is None:
            rest = servers[at:]
            for later, listed in zip(rest, await _gather(rest, kind), strict=True):
                if has(listed):
                    return later
            return None
        if has(known):
            return server
    return None


def _known(server: Upstream, kind: str) -> _Listed | None:
    """`server`'s valid list of `kind` when it is known without waiting (`surface_known`), else None."""
    listed = server.surface_known(kind)
    return None if listed is None else _valid(listed, kind)


def _valid(listed: list[Any], kind: str) -> _Listed:
    """The items of a server's list of `kind` that have their key, made once per list (a kept list stays the same
    object until the child says it changed): a `resources/read` no longer filters and compares every item of every
    server the client may read (~30 µs a call per 100 items)."""
    entry = _VALID.get(id(listed))
    if entry is None or entry[0] is not listed:
        if len(_VALID) >= MAX_KEPT_LISTS:
            _VALID.clear()
        key = KEY[kind]
        valid = _Listed([item for item in listed if isinstance(item, dict) and isinstance(item.get(key), str)], key)
        # The list is kept with what was made of it, so its id cannot be reused by another list meanwhile.
        entry = _VALID[id(listed)] = (listed, valid)
    return entry[1]


# -- URI templates (RFC 6570), matched by shape --------------------------------------------------------

_EXPRESSION = re.compile(r"\{([+#./;?&]?)[^{}]*\}")


# A pattern nothing matches: the shape of a head none of whose templates is valid.
_NOTHING: Final = r"(?!)"


class _Shapes:
    """One server's URI templates, kept with its list: grouped by their head (the text before the first expression),
    the templates of one head compiled into one pattern when a URI first starts with that head. A read looks up each
    head length's slice of the URI and matches only the templates it could be. Compiling a template takes ~0.13 ms
    (Python's regular-expression compiler); matched template by template from a cache of 1,024 patterns, a read
    behind 20 servers of 100 templates compiled all 2,000 again, ~180 ms a read."""

    __slots__ = ("_by_head", "_patterns")

    def __init__(self, templates: Iterable[str]) -> None:
        self._by_head: dict[int, dict[str, list[str]]] = {}
        for template in templates:
            head = template.partition("{")[0]
            self._by_head.setdefault(len(head), {}).setdefault(head, []).append(template)
        self._patterns: dict[str, re.Pattern[str]] = {}

    def match(self, uri: str) -> bool:
        for length, heads in self._by_head.items():
            head = uri[:length]
            templates = heads.get(head)
            if templates is not None and self._pattern(head, templates).fullmatch(uri) is not None:
                return True
        return False

    def _pattern(self, head: str, templates: list[str]) -> re.Pattern[str]:
        pattern = self._patterns.get(head)
        if pattern is None:
            shapes = [shape for shape in map(_template_regex, templates) if shape is not None]
            pattern = self._patterns[head] = re.compile("|".join(f"(?:{shape})" for shape in shapes) or _NOTHING,
                                                        re.DOTALL)
        return pattern


def _template_regex(template: str) -> str | None:
    """The regex a URI expanded from `template` matches: simple expressions one path segment, `+`/`#` anything,
    query expressions an optional query. None for a template that is not one. Non-capturing, so that any number of
    them join into one pattern."""
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
    return "".join(parts)


def template_matches(template: str, uri: str) -> bool:
    """Whether `uri` could be an expansion of the URI template `template`."""
    return _Listed([{"uriTemplate": template}], KEY[TEMPLATES]).matches(uri)


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

