"""Resources, templates, prompts and completion through the real daemon, in front of the conformance fixture.

Server `test` (tests/fixtures/conformsrv.py) offers resources, a template, prompts and completions; server
`json` (the same fixture as a tools-only server) offers none. Client `full` may use all of `test`; client
`tools` may only call its tools, so none of the rest exists for it: empty lists, and every direct route
answers exactly as for something that does not exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.daemon import Daemon, python_command, rpc, write_config

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "conformsrv.py"
VERSION = "2025-11-25"


@dataclass
class Client:
    http: aiohttp.ClientSession
    url: str
    token: str
    session: str = ""

    async def start(self) -> Client:
        async with self.http.post(self.url, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }, headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"}) as response:
            assert response.status == 200, await response.text()
            self.session = response.headers["Mcp-Session-Id"]
            self.capabilities = (await response.json())["result"]["capabilities"]
        return self

    async def __call__(self, method: str, params: Any = None) -> dict[str, Any]:
        return await rpc(self.http, self.url, self.token, method, params,
                         **{"Mcp-Session-Id": self.session, "MCP-Protocol-Version": VERSION})


@pytest.fixture
async def clients(tmp_path: Path) -> AsyncIterator[tuple[Client, Client]]:
    tokens = write_config(
        tmp_path,
        {"test": python_command(str(FIXTURE)), "json": python_command(str(FIXTURE), "json")},
        roles='[roles.full]\nallow = ["test.*", "json.*"]\n[roles.tools]\nallow = ["test.simple_text"]\n',
        clients={"full": ["full"], "tools": ["tools"]},
    )
    async with Daemon(tmp_path) as daemon, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield (await Client(http, daemon.url, tokens["full"]).start(),
               await Client(http, daemon.url, tokens["tools"]).start())


async def test_a_granted_client_lists_reads_gets_and_completes(clients: tuple[Client, Client]) -> None:
    full, _ = clients
    assert full.capabilities["resources"] == {"subscribe": True, "listChanged": True}
    resources = (await full("resources/list"))["result"]["resources"]
    assert [r["uri"] for r in resources] == ["test://static-binary", "test://static-text", "test://watched-resource"]
    templates = (await full("resources/templates/list"))["result"]["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["test://template/{id}/data"]
    text = (await full("resources/read", {"uri": "test://static-text"}))["result"]["contents"][0]
    assert text["uri"] == "test://static-text" and text["text"]
    item = (await full("resources/read", {"uri": "test://template/42/data"}))["result"]["contents"][0]
    assert "42" in item["text"]
    prompts = [p["name"] for p in (await full("prompts/list"))["result"]["prompts"]]
    assert prompts == ["test__prompt_with_arguments", "test__prompt_with_embedded_resource",
                       "test__prompt_with_image", "test__simple_prompt"]
    got = await full("prompts/get", {"name": "test__prompt_with_arguments", "arguments": {"arg1": "A", "arg2": "B"}})
    assert "A" in str(got["result"]["messages"]) and "B" in str(got["result"]["messages"])
    done = await full("completion/complete", {"ref": {"type": "ref/prompt", "name": "test__prompt_with_arguments"},
                                              "argument": {"name": "arg1", "value": "x"}})
    assert done["result"]["completion"]["values"] == ["x1", "x2"]
    assert (await full("resources/subscribe", {"uri": "test://watched-resource"}))["result"] == {}
    assert (await full("resources/unsubscribe", {"uri": "test://watched-resource"}))["result"] == {}
    unknown = await full("resources/read", {"uri": "test://nothing"})
    assert unknown["error"] == {"code": -32602, "message": "Unknown resource: test://nothing",
                                "data": {"uri": "test://nothing"}}


async def test_a_client_without_the_grants_sees_nothing_and_reaches_nothing(clients: tuple[Client, Client]) -> None:
    full, tools = clients
    for method, key in (("resources/list", "resources"), ("resources/templates/list", "resourceTemplates"),
                        ("prompts/list", "prompts")):
        assert (await tools(method))["result"] == {key: []}
    for method, params, absent in (
        ("resources/read", {"uri": "test://static-text"}, {"uri": "test://absent"}),
        ("resources/read", {"uri": "test://template/1/data"}, {"uri": "test://absent"}),
        ("resources/subscribe", {"uri": "test://watched-resource"}, {"uri": "test://absent"}),
        ("prompts/get", {"name": "test__simple_prompt"}, {"name": "test__absent"}),
        ("completion/complete", {"ref": {"type": "ref/prompt", "name": "test__prompt_with_arguments"},
                                 "argument": {"name": "arg1", "value": ""}},
         {"ref": {"type": "ref/prompt", "name": "test__absent"}, "argument": {"name": "arg1", "value": ""}}),
    ):
        denied, missing = (await tools(method, params))["error"], (await full(method, absent))["error"]
        assert denied["code"] == missing["code"] == -32602
        assert denied["message"].split(":")[0] == missing["message"].split(":")[0]
        assert set(denied.get("data", {})) == set(missing.get("data", {}))
