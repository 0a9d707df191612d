"""`gatewayctl explain`: a policy decision in words, for an operator debugging a policy.

Owns turning a static config (no running daemon) plus a client, a method and arguments into
the lines that say what would happen and which rule (file, role, pattern) decides it. It asks
`policy.decide` — the same function every call goes through — so what it says is what runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gatewayd import surfaces
from gatewayd.config.loader import Snapshot
from gatewayd.policy import Decision, confirm_options, confirm_required, decide, principal_for
from gatewayd.upstream.protocols import dialect_for

# What each canonical surface name grants (surfaces.py), for the operator.
SURFACE_GRANTS = {
    surfaces.READ: "grants listing, reading, subscribing to and unsubscribing from its resources and templates "
                   "(resources/list, resources/templates/list, resources/read, resources/subscribe, "
                   "resources/unsubscribe)",
    surfaces.GET: "grants listing and getting its prompts (prompts/list, prompts/get)",
    surfaces.COMPLETE: "grants completion/complete of its prompts' and templates' arguments, for a client that may "
                       "also see them (prompts/get, resources/read)",
}


def explain(snapshot: Snapshot, client: str, method: str, arguments: Any) -> Iterator[str]:
    """Lines describing the decision for `client` calling canonical `method` with `arguments`."""
    if client not in snapshot.clients:
        yield f"deny: there is no client {client!r} (clients: {', '.join(sorted(snapshot.clients)) or 'none'})"
        return
    server, _, tool = method.partition(".")
    verdict = decide(principal_for(snapshot, client), method, arguments,
                     confirm_required=confirm_required(snapshot, server, tool))
    yield f"{verdict.decision.value}: {_why(verdict.decision, verdict.reason, client, method)}"
    if verdict.rule is not None:
        label = "refused by" if verdict.refused_arguments else "granted by"
        yield f"  {label} {verdict.rule.describe()}"
    if verdict.decision is Decision.CONFIRM:
        options = confirm_options(principal_for(snapshot, client), verdict, method)
        channels = ", ".join(["gatewayctl", *options.channels])
        yield f"  asks: {channels}; denied as expired after {options.timeout:g}s without an answer"
    yield from _existence(snapshot, server, tool)
    config = snapshot.servers.get(server)
    if config is not None and config.relay and verdict.decision is not Decision.DENY and "/" not in tool:
        # Nothing is relayed unless the server's tools.d says so: only then is there something to say.
        yield f"  during the call, {server} may ask the caller's client for: {', '.join(config.relay)}"
    if config is not None and config.isolation != "shared" and verdict.decision is not Decision.DENY:
        yield f"  runs on a child of its own for each {config.isolation} (isolation = \"{config.isolation}\")"
    if config is not None and config.era != "auto" and verdict.decision is not Decision.DENY:
        # Only a fixed era changes how the child starts: "auto" is every MCP server's probe, nothing to say.
        yield f"  spoken to in the {config.era} era without a server/discover probe (era = \"{config.era}\")"


def denied(snapshot: Snapshot, client: str, method: str, arguments: Any) -> bool:
    """Whether `client` calling `method` with `arguments` would be refused (what `explain` says first)."""
    if client not in snapshot.clients:
        return True
    server, _, tool = method.partition(".")
    return decide(principal_for(snapshot, client), method, arguments,
                  confirm_required=confirm_required(snapshot, server, tool)).decision is Decision.DENY


def _why(decision: Decision, reason: str, client: str, method: str) -> str:
    if decision is Decision.ALLOW:
        return f"{client} may call {method}"
    if decision is Decision.CONFIRM:
        return f"{client} may call {method} after a person confirms ({reason})"
    if reason == "arguments":
        return f"{client} may call {method}, but not with these arguments"
    return f"{client} may not call {method} ({reason}); it answers as an unknown method"


def _existence(snapshot: Snapshot, server: str, tool: str) -> Iterator[str]:
    config = snapshot.servers.get(server)
    if config is None:
        yield f"  note: no tool server {server!r} in tools.d, so the call would answer as an unknown method"
        return
    dialect = dialect_for(server, config)
    if tool in SURFACE_GRANTS:
        if dialect.offers_surfaces:
            yield f"  note: {server}.{tool} {SURFACE_GRANTS[tool]}"
        else:
            yield (f"  note: {server} is a {dialect.protocol.upper()} server: it offers no resources, prompts or "
                   "completions, so there is nothing this would grant")
        return
    declared = dialect.declares(tool)
    if declared is False:
        yield f"  note: {server}.toml declares no method {tool!r}, so the call would answer as an unknown method"
    elif declared is None:
        yield (f"  note: {server} is an {dialect.protocol.upper()} server; whether it has a tool {tool!r} is known "
               "only once it runs")
