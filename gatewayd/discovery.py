"""Discovery for plain JSON-RPC callers: `rpc.discover` answers an OpenRPC 1.3 document of exactly the methods the
calling client may call.

Owns the document's shape: each method under its canonical `server.method` name, its description, its parameters
(one by-name Content Descriptor per property of its input schema, the whole schema kept in `x-input-schema`), its
result (what a direct call answers: a plain JSON-RPC server's own value, an MCP tool's CallToolResult), the errors
a caller can expect of it, and whether it waits for a person (`x-requires-confirmation`). A method the client may not
call is not in it, exactly as for a method that does not exist. Does not own the decision (policy.py), the MCP tool
list (catalog.py) or answering a call (gateway.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gatewayd import __version__, errors, policy
from gatewayd.policy import Decision, Principal
from gatewayd.upstream.api import ToolDef, Upstream

logger = logging.getLogger(__name__)

METHOD = "rpc.discover"
# The version of the OpenRPC specification the document follows.
OPENRPC_VERSION = "1.3.2"
CONFIRM_EXTENSION = "x-requires-confirmation"
SCHEMA_EXTENSION = "x-input-schema"
# What a direct call of an MCP tool answers (README "Errors"): its CallToolResult, with its output schema if it has one.
_CALL_TOOL_RESULT: dict[str, Any] = {
    "type": "object", "required": ["content"],
    "properties": {"content": {"type": "array"}, "isError": {"type": "boolean"}},
}
_CONFIRM_ERRORS = [
    {"code": errors.CONFIRMATION_DENIED, "message": "a person denied the call"},
    {"code": errors.CONFIRMATION_EXPIRED, "message": "nobody confirmed the call in time"},
    {"code": errors.CONFIRMATION_PENDING,
     "message": 'waits for a person (asked with _meta {"io.gatewayd/approval": "retry"}): send the same call again'},
]
_MCP_TOOL_ERRORS = [{"code": errors.TOOL_ERROR, "message": "the tool failed (data.result: its CallToolResult)"}]


async def document(principal: Principal | None, servers: Mapping[str, Upstream]) -> dict[str, Any]:
    """The OpenRPC document of the methods `principal` may call (or call once a person confirms), by name; None (a
    client a reload removed) may call nothing."""
    methods: list[dict[str, Any]] = []
    if principal is not None:
        visible = sorted((s for s in servers.values() if policy.may_see_server(principal, s.name)),
                         key=lambda server: server.name)
        listed = await asyncio.gather(*(_offered(server) for server in visible), return_exceptions=True)
        for server, tools in zip(visible, listed, strict=True):
            if isinstance(tools, BaseException):
                logger.warning("server=%s left out of %s: %s", server.name, METHOD, tools)
                continue
            methods.extend(_methods(principal, server, tools))
    return {
        "openrpc": OPENRPC_VERSION,
        "info": {"title": "gatewayd", "version": __version__,
                 "description": "The methods this client may call, by their canonical server.method names."},
        "methods": methods,
    }


async def _offered(server: Upstream) -> list[ToolDef]:
    """What a direct call can reach: the server's tools, and an ACP agent's session methods (upstream/acp.py)."""
    tools = await server.tools()
    if server.protocol != "acp":
        return tools
    from gatewayd.upstream.acp import direct_methods  # loaded by an agent's first call or listing

    return tools + direct_methods()


def _methods(principal: Principal, server: Upstream, tools: list[ToolDef]) -> list[dict[str, Any]]:
    described: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in sorted(tools, key=lambda t: t.method):
        name = f"{server.name}.{tool.method}"
        decision = policy.may_call(principal, name, confirm_required=server.needs_confirmation(tool.method))
        if decision is Decision.DENY or name in seen:
            continue
        seen.add(name)
        described.append(_method(name, tool, decision is Decision.CONFIRM))
    return described


def _method(name: str, tool: ToolDef, confirm: bool) -> dict[str, Any]:
    schema = tool.input_schema
    properties = schema.get("properties")
    required = schema.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    params = [
        {"name": param, "schema": param_schema if isinstance(param_schema, dict) else {}, "required": param in
         required_names}
        for param, param_schema in (properties.items() if isinstance(properties, dict) else ())
    ]
    method: dict[str, Any] = {"name": name, "params": params, "paramStructure": "by-name",
                              "result": {"name": "result", "schema": _result_schema(tool)},
                              SCHEMA_EXTENSION: schema, CONFIRM_EXTENSION: confirm}
    if tool.description:
        method["description"] = tool.description
    method_errors = (_CONFIRM_ERRORS if confirm else []) + (_MCP_TOOL_ERRORS if tool.raw is not None else [])
    if method_errors:
        method["errors"] = method_errors
    return method


def _result_schema(tool: ToolDef) -> dict[str, Any]:
    """A plain JSON-RPC method's result is whatever its server answers; an MCP tool's is its CallToolResult."""
    if tool.raw is None:
        return {}
    output = tool.raw.get("outputSchema")
    if not isinstance(output, dict):
        return _CALL_TOOL_RESULT
    return {**_CALL_TOOL_RESULT, "properties": {**_CALL_TOOL_RESULT["properties"], "structuredContent": output}}
