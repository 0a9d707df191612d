"""What each client may see: MCP tool and prompt names, the aggregated `tools/list`, and who hears that it changed.

Owns the exposure name format of tools and prompts — `<prefix><separator><name>`, `prefix` a server's tools.d
`prefix` (its name by default), or the name alone for a server whose `prefix = ""` — and reversing it exactly:
tool names are checked against the alphabet and length LLM APIs accept (`^[A-Za-z0-9_-]{1,64}$`, settings
`tool_name_max_chars` up to MCP's 128 and `tool_name_dots`); listing every tool a principal may call across
the servers of its generation in a deterministic order (marking those that wait for a person); and choosing
which sessions are told `notifications/tools/list_changed`. Two servers that would give one name to two tools
or prompts (only servers without a prefix can) are resolved one way everywhere: the first in listing order
(servers with a prefix, then those without, each in name order) has it, a warning is logged. Does not own
the decision itself (policy.py) or routing a call (routing.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any

from gatewayd import policy
from gatewayd.jsonrpc import Encoded, ReadOnlyList
from gatewayd.policy import Decision, Principal
from gatewayd.sessions import Sessions
from gatewayd.tokens import TokenTable
from gatewayd.upstream.api import ToolDef, Upstream

logger = logging.getLogger(__name__)

# LLM APIs reject tool names outside this alphabet and length; MCP 2025-11-25 allows '.' too, and 128 characters.
DEFAULT_MAX_TOOL_NAME_CHARS = 64
MAX_TOOL_NAME_CHARS = 128
# A prompt's own name may use any characters; it is only kept to a sane length.
MAX_PROMPT_CHARS = 256
# The longest tools.d `prefix` (config/models.py), which a prompt name as clients see it may carry.
MAX_PREFIX_CHARS = 64
# Replaced tool lists are not announced to the catalog: their indexes are dropped all at once past this many.
MAX_INDEXED_LISTS = 1024
# Listings remembered (one per principal; a reload makes new principals): all dropped at once past this many.
MAX_CACHED_LISTINGS = 256
CONFIRM_NOTE = "[Needs a person's confirmation before it runs.] "
CONFIRM_META = "io.gatewayd/requiresConfirmation"
LIST_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


class Catalog:
    """Tool and prompt names in one format, and the tools a principal may see."""

    def __init__(self, separator: str = "__", max_tool_chars: int = DEFAULT_MAX_TOOL_NAME_CHARS,
                 dots: bool = False) -> None:
        if not 1 <= max_tool_chars <= MAX_TOOL_NAME_CHARS:
            raise ValueError(f"tool names are 1..{MAX_TOOL_NAME_CHARS} characters")
        self.separator = separator
        self.max_tool_chars = max_tool_chars
        self._alphabet = f"A-Za-z0-9_{'.' if dots else ''}-"
        self._tool_name = re.compile(rf"[{self._alphabet}]{{1,{max_tool_chars}}}")
        # The last server table indexed by prefix (a generation's table stays the same object while it is current).
        self._indexed: tuple[Mapping[str, Upstream], dict[str, Upstream], list[Upstream]] | None = None
        # The last listing of each principal, with what it was made from (`list_tools`).
        self._listings: dict[int, tuple[Principal, Mapping[str, Upstream], tuple[int, ...], list[Any], Encoded]] = {}
        # Tool lists by method, keyed by the list's id (`input_schema`).
        self._tool_indexes: dict[int, tuple[list[ToolDef], dict[str, ToolDef]]] = {}

    def tool_name(self, prefix: str, method: str) -> str | None:
        """The MCP tool name of `method` of a server exposed under `prefix` ("": the method's own name), or None
        when it cannot be a valid one."""
        name = f"{prefix}{self.separator}{method}" if prefix else method
        return name if self._tool_name.fullmatch(name) else None

    async def find_tool(
        self, name: str, principal: Principal, servers: Mapping[str, Upstream]
    ) -> tuple[Upstream, str] | None:
        """The server and method an MCP tool name stands for: the server whose prefix it starts with, else the first
        server (in name order) exposed without a prefix that offers it and that the principal may see. A name that
        starts with a prefix whose server does not offer the rest goes to a server without a prefix that offers it
        whole, as `tools/list` shows it. Exact: no folding of any kind."""
        if not self._tool_name.fullmatch(name):
            return None
        prefixed, bare = self._index(servers)
        prefix, sep, method = name.partition(self.separator)
        server = prefixed.get(prefix) if sep and method else None
        if server is not None and self.separator not in method:
            # Only with servers that have no prefix is the prefixed one asked whether it has the tool.
            if not bare or await self._offers(server, method):
                return server, method
            return await self._bare(name, principal, bare) or (server, method)
        # A prefix may hold the separator itself (`my_server` with `_`): the later splits too; of several, the first
        # that offers the tool (`test` and `test_input` both prefixes, `test_input_x` is the one that has `x`).
        found = self._prefixed(name, prefixed) if sep else []
        for candidate, own in found if len(found) > 1 or (found and bare) else ():
            if await self._offers(candidate, own):
                return candidate, own
        return await self._bare(name, principal, bare) or (found[0] if found else None)

    async def _offers(self, server: Upstream, method: str) -> bool:
        """Whether `server` offers `method`: looked up in its known list's index when it has one, else asked (may
        start it)."""
        known = server.tools_known()
        if known is not None:
            return method in self._by_method(known)
        return await server.has_tool(method)

    async def _bare(self, name: str, principal: Principal, bare: list[Upstream]) -> tuple[Upstream, str] | None:
        """The first server exposed without a prefix that offers `name` and that the principal may see."""
        for candidate in bare:
            # A list known without waiting is looked up in its index: asking each server in turn (a coroutine, and
            # whether the client may see it) cost ~2.8 µs a server passed, ~280 µs a call behind 100 of them.
            known = candidate.tools_known()
            if known is not None:
                if name in self._by_method(known) and policy.may_see_server(principal, candidate.name):
                    return candidate, name
            elif policy.may_see_server(principal, candidate.name) and await candidate.has_tool(name):
                return candidate, name
        return None

    def _prefixed(self, name: str, prefixed: dict[str, Upstream]) -> list[tuple[Upstream, str]]:
        """(server, its own name) for every split of `name` at a separator whose left part is a server's prefix, in
        listing order."""
        found: list[tuple[Upstream, str]] = []
        at = name.find(self.separator)
        while at > 0:
            rest = name[at + len(self.separator):]
            server = prefixed.get(name[:at])
            if server is not None and rest:
                found.append((server, rest))
            at = name.find(self.separator, at + 1)
        return sorted(found, key=lambda pair: pair[0].name)

    def _index(self, servers: Mapping[str, Upstream]) -> tuple[dict[str, Upstream], list[Upstream]]:
        """Servers by prefix, and those without one in name order; made once per generation's server table."""
        if self._indexed is None or self._indexed[0] is not servers:
            prefixed = {server.prefix: server for server in servers.values() if server.prefix}
            bare = sorted((server for server in servers.values() if not server.prefix), key=lambda s: s.name)
            self._indexed = (servers, prefixed, bare)
        return self._indexed[1], self._indexed[2]

    def _by_method(self, tools: list[ToolDef]) -> dict[str, ToolDef]:
        """`tools` by method, the first of a name as the listing has it; made once per list (a server's list stays
        the same object until it changes)."""
        entry = self._tool_indexes.get(id(tools))
        if entry is None or entry[0] is not tools:
            if len(self._tool_indexes) >= MAX_INDEXED_LISTS:
                self._tool_indexes.clear()
            index: dict[str, ToolDef] = {}
            for tool in tools:
                index.setdefault(tool.method, tool)
            # The list is kept with its index, so its id cannot be reused by another list meanwhile.
            entry = self._tool_indexes[id(tools)] = (tools, index)
        return entry[1]

    def prompt_name(self, prefix: str, prompt: str) -> str | None:
        """The name clients see for a prompt of a server exposed under `prefix` ("": the prompt's own name), or None
        for an empty or overlong prompt name."""
        if not prompt or len(prompt) > MAX_PROMPT_CHARS:
            return None
        return f"{prefix}{self.separator}{prompt}" if prefix else prompt

    def prompt_candidates(self, name: str, servers: Mapping[str, Upstream]) -> list[tuple[Upstream, str]]:
        """Who a prompt name as clients see it may stand for, in listing order: (server, the server's own prompt
        name) for each server with a prefix it starts with, then (server, `name`) for each server without one. The
        first of them the client may use and that lists that prompt has it (as in the listing)."""
        if not name or len(name) > MAX_PROMPT_CHARS + len(self.separator) + MAX_PREFIX_CHARS:
            return []
        prefixed, bare = self._index(servers)
        found = [(server, own) for server, own in self._prefixed(name, prefixed) if len(own) <= MAX_PROMPT_CHARS]
        if len(name) <= MAX_PROMPT_CHARS:
            found += [(server, name) for server in bare]
        return found

    async def marked_arguments(self, name: str, principal: Principal, servers: Mapping[str, Upstream],
                               mark: str) -> list[tuple[str, Any]]:
        """(argument, its `mark` value) for each argument of tool `name` whose schema in the `inputSchema` this
        principal is shown carries `mark`; none for a tool it does not see. Found as a call to it is routed
        (find_tool), not by listing every tool: on every modern `tools/call`. Whether the principal sees the tool is
        decided only for a tool that has such arguments: for any other the answer is the same either way."""
        try:
            found = await self.find_tool(name, principal, servers)
            if found is None:
                return []
            server, method = found
            tool = self._by_method(await server.tools()).get(method)
        except Exception:  # as list_tools leaves out a server that cannot list: the call itself will say why
            return []
        if tool is None:
            return []
        schema = tool.raw.get("inputSchema") if tool.raw is not None else tool.input_schema
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            return []
        marked = [(argument, spec[mark]) for argument, spec in properties.items()
                  if isinstance(spec, dict) and mark in spec]
        if not marked or _listing(principal, server, tool) is Decision.DENY:
            return []
        return marked

    async def list_tools(self, principal: Principal, servers: Mapping[str, Upstream]) -> Encoded:
        """Every tool the principal may call, across servers, in a deterministic order. Made again only when
        something it depends on changed: the principal (a reload makes new ones), the server table, or a server's
        tool list (each stays the same object until it changes); 2,000 tools took ~20 ms to describe. The same
        result object is answered until then, so its JSON text is made once too (jsonrpc.Encoded: encoding those
        2,000 tools took 4-6 ms)."""
        visible = [s for s in servers.values() if policy.may_see_server(principal, s.name)]
        # Each server's list as it stands, when none has to be asked: gathering 100 servers' `tools()` took ~0.3 ms.
        known = [tools for tools in (s.tools_known() for s in visible) if tools is not None]
        listed: list[list[ToolDef] | BaseException] = list(known) if len(known) == len(visible) else \
            await asyncio.gather(*(s.tools() for s in visible), return_exceptions=True)
        key = tuple(map(id, listed))
        cached = self._listings.get(id(principal))
        if cached is not None and cached[0] is principal and cached[1] is servers and cached[2] == key:
            return cached[4]
        answer = Encoded(tools=ReadOnlyList(self._describe_all(principal, visible, listed)))
        if not any(isinstance(result, BaseException) for result in listed):
            if len(self._listings) >= MAX_CACHED_LISTINGS:
                self._listings.clear()
            # The lists themselves are kept with their ids, so an id cannot be reused by another list meanwhile.
            self._listings[id(principal)] = (principal, servers, key, listed, answer)
        return answer

    def _describe_all(self, principal: Principal, visible: list[Upstream],
                      listed: list[list[ToolDef] | BaseException]) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        names: set[str] = set()
        for server, result in sorted(zip(visible, listed, strict=True), key=lambda pair: listing_order(pair[0])):
            if isinstance(result, BaseException):
                logger.warning("server=%s left out of tools/list: %s", server.name, result)
                continue
            for tool in sorted(result, key=lambda t: t.method):
                decision = _listing(principal, server, tool)
                if decision is Decision.DENY:
                    continue
                described = self._describe(server, tool, decision)
                if described and described["name"] in names:
                    # Calls go to the first (find_tool): so does the list.
                    logger.warning("server=%s tool %r left out of tools/list: another server's has its name",
                                   server.name, tool.method)
                elif described:
                    names.add(described["name"])
                    tools.append(described)
        return tools

    def _describe(self, server: Upstream, tool: ToolDef, decision: Decision) -> dict[str, Any]:
        name = self.tool_name(server.prefix, tool.method)
        if name is None:
            logger.warning("server=%s tool %.200r left out of tools/list: its MCP name is not 1..%d characters of "
                           "[%s]; call it directly as %s.<tool>", server.name, tool.method, self.max_tool_chars,
                           self._alphabet, server.name)
            return {}
        if tool.raw is not None:
            described = {**tool.raw, "name": name}
        else:
            described = {"name": name, "inputSchema": tool.input_schema}
            if tool.description:
                described["description"] = tool.description
        if decision is Decision.CONFIRM:
            _mark_confirm(described)
        return described


def listing_order(server: Upstream) -> tuple[bool, str]:
    """Servers with a prefix first, then those without, each in name order: who has a name two servers give."""
    return (not server.prefix, server.name)


def _listing(principal: Principal, server: Upstream, tool: ToolDef) -> Decision:
    return policy.may_call(principal, f"{server.name}.{tool.method}",
                           confirm_required=server.needs_confirmation(tool.method))


def _mark_confirm(described: dict[str, Any]) -> None:
    """Say in the listing that a tool waits for a person, for the model (description) and programs (_meta)."""
    described["description"] = CONFIRM_NOTE + str(described.get("description") or "")
    meta = described.get("_meta")
    described["_meta"] = {**(meta if isinstance(meta, dict) else {}), CONFIRM_META: True}


def tell_tools_changed(sessions: Sessions, tokens: TokenTable, server: str) -> None:
    """A server's tool list changed: tell, on their GET streams, the sessions whose client may see it."""
    logger.info("server=%s tools changed; notifying sessions", server)

    def may_see(client: str) -> bool:
        principal = tokens.principal(client)
        return principal is not None and policy.may_see_server(principal, server)

    sessions.broadcast(LIST_CHANGED, to=lambda session: may_see(session.client))
