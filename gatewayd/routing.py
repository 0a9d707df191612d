"""Route: a call's name → its canonical target, one tool server of the call's generation and one method.

Owns the two spellings of a target — a direct `server.method` and an MCP tool name (catalog.py's
format) — resolving both to the same `Target` before anything is decided (and a resource URI, prompt
name or completion reference to the server that owns it, surfaces.py), and the error a caller gets for
a name that does not exist, which is the very error a denied name gets (authorize.py).
An unknown name is recorded as denied (reason "unknown"). Does not own the decision.
"""

from __future__ import annotations

from gatewayd import surfaces, tasks
from gatewayd.calls import TOOLS_CALL, Call, Target
from gatewayd.catalog import Catalog
from gatewayd.errors import GatewayError, MethodNotFound, UnknownTool
from gatewayd.records import Records
from gatewayd.surfaces import Surfaces
from gatewayd.upstream.api import Upstream

# No tool server offers a longer name (a file name, a dot, and a tool name the MCP spec keeps to 128 characters);
# a longer one is unknown at once, before it costs a pattern match or a place in a memo.
MAX_NAME_CHARS = 512


async def route(call: Call, catalog: Catalog, records: Records) -> Target:
    """The target of the call; `call.method` becomes its canonical name. Raises `unknown(call)`."""
    found: tuple[Upstream, str] | None = None
    if len(call.name) > MAX_NAME_CHARS:
        pass
    elif call.route == TOOLS_CALL:
        found = await catalog.find_tool(call.name, call.ctx.principal, call.ctx.servers)
    elif (parts := _split_direct(call.name)) is not None and (server := call.ctx.servers.get(parts[0])) is not None:
        found = server, parts[1]
    if found is None:
        records.decided(call, "deny", reason="unknown")
        raise unknown(call)
    target = Target(*found)
    call.method = target.canonical
    return target


async def route_surface(call: Call, owners: Surfaces, records: Records) -> Target:
    """The target of a resource, prompt or completion call (surfaces.py): the server that owns its URI, prompt or
    reference among those the client may use, and the method it is decided as. Raises `unknown(call)`."""
    server = await owners.owner(call)
    if server is None:
        records.decided(call, "deny", reason="unknown")
        raise unknown(call)
    target = Target(server, surfaces.canonical_method(call.route), surface=True)
    call.method = target.canonical
    return target


def _split_direct(name: str) -> tuple[str, str] | None:
    server, dot, method = name.partition(".")
    return (server, method) if dot else None


def unknown(call: Call) -> GatewayError:
    """What the caller is told for a name that does not exist or that it may not call: one answer for both.
    (Made only when raised: an exception is costly to make on every call.)"""
    if call.route == TOOLS_CALL:
        return UnknownTool(call.name)
    if call.route in surfaces.ROUTES:
        return surfaces.unknown(call)
    if call.route in tasks.FOLLOW_UPS:
        return tasks.unknown(call.name)
    return MethodNotFound(call.name)
