"""`rpc.discover` through the real daemon on the shipped examples: two clients of different grants each get an
OpenRPC document of exactly the methods they may call, and every method in it can be called by that name."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatewayd.config.edit import set_client_token
from gatewayd.errors import CONFIRMATION_DENIED, TOOL_ERROR
from gatewayd.tokens import hash_token, new_token
from tests.daemon import REPO, Daemon, rpc

# Like the shipped roles, and granting nothing of the other shipped servers.
ROLES = """
[roles.developer]
allow = ["calc.*", "clock.*"]
confirm = ["shell.run"]
[roles.readonly]
allow = ["clock.now"]
[roles.readonly.args."clock.now".timezone]
regex = "[A-Za-z_+-]{1,32}(/[A-Za-z_+-]{1,32}){0,2}"
optional = true
"""


@pytest.fixture
async def two_clients(tmp_path: Path) -> AsyncIterator[tuple[Daemon, dict[str, str]]]:
    """The shipped servers with `laptop` (role developer: calc.*, clock.*, shell.run confirmed) and `kiosk` (role
    readonly: clock.now with an argument rule)."""
    shutil.copytree(REPO / "tools.d", tmp_path / "tools.d")
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "roles.toml").write_text(ROLES)
    tokens = {"laptop": new_token(), "kiosk": new_token()}
    for client, role in (("laptop", "developer"), ("kiosk", "readonly")):
        set_client_token(tmp_path / "policies" / "clients.toml", client, hash_token(tokens[client]), [role])
    async with Daemon(tmp_path) as daemon:
        yield daemon, tokens


def check_openrpc(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The document's required OpenRPC 1.3 members are there and well formed; its methods by name."""
    assert document["openrpc"] == "1.3.2"
    assert isinstance(document["info"]["title"], str) and isinstance(document["info"]["version"], str)
    names = [method["name"] for method in document["methods"]]
    assert len(names) == len(set(names)), "method names must be unique"
    for method in document["methods"]:
        assert isinstance(method["params"], list) and method["paramStructure"] == "by-name"
        for param in method["params"]:
            assert isinstance(param["name"], str) and isinstance(param["schema"], dict)
        assert isinstance(method["result"]["name"], str) and isinstance(method["result"]["schema"], dict)
    return {method["name"]: method for method in document["methods"]}


async def test_each_client_discovers_exactly_what_it_may_call(
    two_clients: tuple[Daemon, dict[str, str]], http: aiohttp.ClientSession
) -> None:
    daemon, tokens = two_clients
    laptop = check_openrpc((await rpc(http, daemon.url, tokens["laptop"], "rpc.discover"))["result"])
    kiosk = check_openrpc((await rpc(http, daemon.url, tokens["kiosk"], "rpc.discover"))["result"])
    assert sorted(laptop) == ["calc.add", "calc.divide", "calc.echo", "calc.log", "calc.multiply", "calc.subtract",
                              "clock.countdown", "clock.now", "shell.run"]
    assert sorted(kiosk) == ["clock.now"]
    # A plain JSON-RPC method: its declared schema as by-name params, whatever result its server gives.
    add = laptop["calc.add"]
    assert add["description"] == "Add two numbers"
    assert add["params"] == [{"name": "a", "schema": {"type": "number"}, "required": True},
                             {"name": "b", "schema": {"type": "number"}, "required": True}]
    assert add["result"]["schema"] == {} and add["x-requires-confirmation"] is False and "errors" not in add
    # An MCP tool: its CallToolResult; its failure is -32010 on this route.
    now = kiosk["clock.now"]
    assert now["params"][0]["name"] == "timezone" and now["params"][0]["required"] is False
    assert now["x-input-schema"]["additionalProperties"] is False
    assert now["result"]["schema"]["required"] == ["content"]
    assert [error["code"] for error in now["errors"]] == [TOOL_ERROR]
    # A method that waits for a person says so.
    run = laptop["shell.run"]
    assert run["x-requires-confirmation"] is True and CONFIRMATION_DENIED in [e["code"] for e in run["errors"]]
    # What is discovered is callable by that name; what is not answers as unknown.
    assert (await rpc(http, daemon.url, tokens["kiosk"], "clock.now", {"timezone": "UTC"}))["result"]["isError"] \
        is False
    for hidden in ("calc.add", "shell.run", "clock.countdown"):
        error = (await rpc(http, daemon.url, tokens["kiosk"], hidden, {}))["error"]
        assert error == {"code": -32601, "message": "Method not found"}


async def test_discovery_needs_a_token(
    two_clients: tuple[Daemon, dict[str, str]], http: aiohttp.ClientSession
) -> None:
    daemon, _ = two_clients
    body = {"jsonrpc": "2.0", "id": 1, "method": "rpc.discover"}
    async with http.post(daemon.url, json=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 401
