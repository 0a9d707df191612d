"""Exposure names: tool names within the limit the operator set (64 by default, MCP's 128 at most), and prompt
names under a server's tools.d `prefix`, collisions resolved as for tools. Through the real gateway pipeline,
behind scripted upstreams (tests/test_gateway.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.gateway import Gateway
from gatewayd.jsonrpc import Request
from gatewayd.policy import Grant, Principal
from gatewayd.settings import Settings
from gatewayd.upstream.api import Upstream
from tests.test_gateway import Scripted, in_memory_gateway

EVERYONE = Principal("all", (Grant("all", "p.toml", allow=("*",)),))


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, AuditLog]]:
    async with in_memory_gateway(tmp_path / "audit.jsonl") as pair:
        yield pair


async def _ask(gateway: Gateway, servers: dict[str, Scripted], method: str, params: Any = None,
               principal: Principal = EVERYONE) -> dict[str, Any]:
    upstreams: dict[str, Upstream] = dict(servers)
    return await gateway.dispatch(CallContext(principal, upstreams), Request(1, method, params))


def _tools(answer: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in answer["result"]["tools"]]


@pytest.mark.parametrize(("limit", "dots"), [(64, False), (128, False), (128, True), (1, False)])
async def test_tool_names_over_the_limit_are_left_out_with_a_warning_and_still_callable_directly(
    gateway: tuple[Gateway, AuditLog], limit: int, dots: bool, caplog: pytest.LogCaptureFixture
) -> None:
    gw, _ = gateway
    gw.catalog = Catalog("__", limit, dots)
    # Bare names, so the limit is the tool's own: one at the limit, one over it, one with a dot.
    at, over = "t" * limit, "u" * (limit + 1)
    server = Scripted("s", [at, over, "v.w"], exposed="")
    with caplog.at_level(logging.WARNING, logger="gatewayd.catalog"):
        listed = _tools(await _ask(gw, {"s": server}, "tools/list"))
    assert listed == [at, *(["v.w"] if dots and limit >= 3 else [])]
    assert f"server=s tool {over!r} left out of tools/list" in caplog.text
    refused = await _ask(gw, {"s": server}, "tools/call", {"name": over, "arguments": {}})
    assert (refused["error"]["code"], refused["error"]["message"]) == (-32602, f"Unknown tool: {over}")
    assert "result" in await _ask(gw, {"s": server}, f"s.{over}", {})  # the direct route knows no such limit
    assert "result" in await _ask(gw, {"s": server}, "tools/call", {"name": at, "arguments": {}})


async def test_the_limit_counts_the_whole_name_prefix_included(gateway: tuple[Gateway, AuditLog]) -> None:
    gw, _ = gateway
    server = Scripted("srv", ["a" * (64 - 5), "b" * (64 - 4)])  # "srv__" is 5 characters
    assert _tools(await _ask(gw, {"srv": server}, "tools/list")) == ["srv__" + "a" * 59]


@pytest.mark.parametrize("value", [0, 129])
def test_the_name_limit_setting_is_1_to_128(value: int, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="tool_name_max_chars"):
        Settings(config_dir=tmp_path, tool_name_max_chars=value)
    assert Settings(config_dir=tmp_path, tool_name_max_chars=128).tool_name_max_chars == 128
    assert Settings(config_dir=tmp_path).tool_name_max_chars == 64


def _prompts(server: Scripted, *names: str) -> Scripted:
    server.surfaces = {"prompts": [{"name": name, "description": f"{name} of {server.name}"} for name in names]}
    return server


async def test_prompts_take_the_servers_prefix_and_an_unprefixed_collision_goes_to_the_first(
    gateway: tuple[Gateway, AuditLog], caplog: pytest.LogCaptureFixture
) -> None:
    gw, _ = gateway
    servers = {
        "docs": _prompts(Scripted("docs", [], exposed="d"), "greet"),
        "plain1": _prompts(Scripted("plain1", [], exposed=""), "greet", "only1"),
        "plain2": _prompts(Scripted("plain2", [], exposed=""), "greet", "only2"),
    }
    with caplog.at_level(logging.WARNING, logger="gatewayd.surfaces"):
        listed = (await _ask(gw, servers, "prompts/list"))["result"]["prompts"]
    assert [(p["name"], p["description"]) for p in listed] == [
        ("d__greet", "greet of docs"), ("greet", "greet of plain1"), ("only1", "only1 of plain1"),
        ("only2", "only2 of plain2")]
    assert "server=plain2 also lists 'greet'; plain1's is kept" in caplog.text
    await _ask(gw, servers, "prompts/get", {"name": "greet", "arguments": {}})
    await _ask(gw, servers, "prompts/get", {"name": "d__greet"})
    await _ask(gw, servers, "prompts/get", {"name": "only2"})
    await _ask(gw, servers, "completion/complete", {"ref": {"type": "ref/prompt", "name": "greet"},
                                                    "argument": {"name": "a", "value": ""}})
    assert servers["plain1"].received == [
        ("surface", "prompts/get", {"name": "greet", "arguments": {}}),
        ("surface", "completion/complete", {"ref": {"type": "ref/prompt", "name": "greet"},
                                            "argument": {"name": "a", "value": ""}})]
    assert servers["docs"].received == [("surface", "prompts/get", {"name": "greet"})]
    assert servers["plain2"].received == [("surface", "prompts/get", {"name": "only2"})]
    # The server's name is no name for its prompts when it has a prefix of its own.
    assert (await _ask(gw, servers, "prompts/get", {"name": "docs__greet"}))["error"]["code"] == -32602


async def test_a_collision_is_resolved_among_what_the_client_may_use(gateway: tuple[Gateway, AuditLog]) -> None:
    gw, _ = gateway
    servers = {"plain1": _prompts(Scripted("plain1", [], exposed=""), "greet"),
               "plain2": _prompts(Scripted("plain2", [], exposed=""), "greet")}
    # plain1 does not exist for this client: plain2's prompt is the one it sees, and gets.
    some = Principal("some", (Grant("some", "p.toml", allow=("plain2.prompts/get",)),))
    listed = (await _ask(gw, servers, "prompts/list", principal=some))["result"]["prompts"]
    assert [p["description"] for p in listed] == ["greet of plain2"]
    assert "result" in await _ask(gw, servers, "prompts/get", {"name": "greet"}, principal=some)
    assert servers["plain1"].received == [] and len(servers["plain2"].received) == 1
