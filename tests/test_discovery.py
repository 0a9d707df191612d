"""The OpenRPC document `rpc.discover` answers (discovery.py), from the tools servers offer and the client's grants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gatewayd import discovery
from gatewayd.policy import Grant, Principal
from gatewayd.upstream.api import ToolDef, Upstream
from tests.test_gateway import Scripted

OUTPUT = {"type": "object", "properties": {"iso": {"type": "string"}}}
SCHEMA = {"type": "object", "properties": {"zone": {"type": "string"}, "n": {"type": "integer"}}, "required": ["n"]}


@dataclass
class Offering(Scripted):
    """A scripted server whose tools are MCP tools with schemas of their own."""

    async def tools(self) -> list[ToolDef]:
        return [ToolDef(tool, "", SCHEMA, {"name": tool, "inputSchema": SCHEMA, "outputSchema": OUTPUT})
                for tool in self.tools_offered]


def principal(allow: list[str], confirm: list[str] | None = None) -> Principal:
    return Principal("c", (Grant("r", "policies/roles.toml", tuple(allow), tuple(confirm or ())),))


async def test_an_mcp_tool_is_described_with_its_schemas_and_gates() -> None:
    servers: dict[str, Upstream] = {"t": Offering("t", ["now", "later", "secret"], confirm=frozenset({"later"}))}
    document: dict[str, Any] = await discovery.document(principal(["t.now", "t.later"]), servers)
    methods = {method["name"]: method for method in document["methods"]}
    assert sorted(methods) == ["t.later", "t.now"]
    now = methods["t.now"]
    assert now["params"] == [{"name": "zone", "schema": {"type": "string"}, "required": False},
                             {"name": "n", "schema": {"type": "integer"}, "required": True}]
    assert now["x-input-schema"] == SCHEMA and "description" not in now
    assert now["result"]["schema"]["properties"]["structuredContent"] == OUTPUT
    assert methods["t.later"]["x-requires-confirmation"] is True and now["x-requires-confirmation"] is False


async def test_nothing_is_discovered_without_a_grant_or_a_client() -> None:
    servers: dict[str, Upstream] = {"t": Offering("t", ["now"])}
    assert (await discovery.document(principal(["other.*"]), servers))["methods"] == []
    assert (await discovery.document(None, servers))["methods"] == []
