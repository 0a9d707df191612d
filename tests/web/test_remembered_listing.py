"""The remembered `tools/list` answer (catalog.py, jsonrpc.Encoded): made and encoded once per principal and catalog
state, each answer's id spliced in. These tests pin that what goes on the wire is byte for byte what encoding the
answer afresh gives, in every shape (legacy JSON and SSE, 2026-07-28 JSON and SSE, pages); that one client's
remembered answer never reaches another client; and that a reload makes it anew.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final

import pytest

from gatewayd import jsonrpc
from gatewayd.reloader import Reloader
from gatewayd.state import DaemonState
from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import LocalClient, running_stack

# Listing needs no child: a jsonrpc server's tools are the methods its file declares.
ALPHA: Final = '\nprotocol = "jsonrpc"\n[methods.one]\ndescription = "one é"\n[methods.two]\n[methods.three]\n' \
               'confirm = true\n'
BETA: Final = '\nprotocol = "jsonrpc"\n[methods.public]\n[methods.secret]\ndescription = "only for all"\n'
# "some" sees both servers, so only the grants of single tools set the two listings apart.
ROLES: Final = '[roles.all]\nallow = ["alpha.*", "beta.*"]\n[roles.some]\nallow = ["alpha.one", "beta.public"]\n'
CLIENTS: Final = {"all": ["all"], "some": ["some"]}
SEEN: Final = {
    "all": ["alpha__one", "alpha__three", "alpha__two", "beta__public", "beta__secret"],
    "some": ["alpha__one", "beta__public"],
}
VERSION: Final = "2026-07-28"
META: Final = {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": {}}
# Ids of each JSON type a request may carry, including ones whose text needs escaping.
IDS: Final = [7, 0, -3, 2**62, "x", "", 'q"\\é\u2028', None]
SSE_HEAD: Final = b"event: message\ndata: "
# Bound on waiting for a child's changed tool list to show.
CHANGE_DEADLINE: Final = 10.0


class Lister:
    """`tools/list` as each client, in each era and shape; the answer's raw bytes and its message."""

    def __init__(self, client: LocalClient, tokens: dict[str, str]) -> None:
        self.client, self.tokens = client, tokens
        self.sessions: dict[str, str] = {}

    async def _session(self, who: str) -> str:
        if who not in self.sessions:
            response = await self.client.post("/mcp", headers={"Authorization": f"Bearer {self.tokens[who]}"}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": who}}})
            self.sessions[who] = response.headers["Mcp-Session-Id"]
        return self.sessions[who]

    async def raw(self, who: str, request_id: Any, *, sse: bool = False, modern: bool = False,
                  cursor: str | None = None, status: int = 200) -> bytes:
        params: dict[str, Any] = {"_meta": META} if modern else {}
        if cursor is not None:
            params["cursor"] = cursor
        headers = {"Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "application/json",
                   "Accept": "text/event-stream" if sse else "application/json"}
        if modern:
            headers.update({"MCP-Protocol-Version": VERSION, "Mcp-Method": "tools/list"})
        else:
            headers["Mcp-Session-Id"] = await self._session(who)
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}
        async with await self.client.post("/mcp", data=json.dumps(body), headers=headers) as response:
            assert response.status == status, await response.text()
            return await response.read()

    async def call_tool(self, who: str, name: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "application/json",
                   "Mcp-Session-Id": await self._session(who)}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": {}}}
        async with await self.client.post("/mcp", data=json.dumps(body), headers=headers) as response:
            answer: dict[str, Any] = await response.json()
            return answer

    async def message(self, who: str, request_id: Any, *, sse: bool = False, modern: bool = False,
                      cursor: str | None = None) -> dict[str, Any]:
        """The answer, after checking its bytes are exactly those of encoding it afresh with its id."""
        raw = await self.raw(who, request_id, sse=sse, modern=modern, cursor=cursor)
        if sse and raw.startswith(SSE_HEAD):
            assert raw.endswith(b"\n\n") and raw.count(SSE_HEAD) == 1
            raw = raw[len(SSE_HEAD):-2]
        # json.loads gives plain dicts: dumps encodes them whole, as every answer was encoded before.
        message: dict[str, Any] = json.loads(raw)
        assert raw == jsonrpc.dumps(message)
        assert list(message) == ["jsonrpc", "id", "result"]
        assert message["id"] == request_id and type(message["id"]) is type(request_id)
        return message


@pytest.fixture
async def lister(tmp_path: Path) -> Any:
    servers = {"alpha": python_command(str(FAULTSRV)) + ALPHA, "beta": python_command(str(FAULTSRV)) + BETA}
    tokens = write_config(tmp_path, servers, ROLES, CLIENTS)
    async with running_stack(tmp_path, audit_path="") as (client, state):
        yield Lister(client, tokens), state, tmp_path


def names(message: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in message["result"]["tools"]]


@pytest.mark.parametrize("modern", [False, True], ids=["legacy", "modern"])
@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
async def test_each_answer_is_the_fresh_encoding_with_its_own_id(lister: Any, sse: bool, modern: bool) -> None:
    listing, _state, _dir = lister
    first: dict[str, dict[str, Any]] = {}
    for request_id in IDS:
        # The two clients alternate, so each answer follows the other client's remembered one.
        for who in ("all", "some"):
            message = await listing.message(who, request_id, sse=sse, modern=modern)
            assert names(message) == SEEN[who]
            first.setdefault(who, message)
            assert message["result"] == first[who]["result"]
    result = first["all"]["result"]
    if modern:
        assert (result["resultType"], result["ttlMs"], result["cacheScope"]) == ("complete", 0, "private")
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gatewayd"
    else:
        assert set(result) == {"tools"}
    three = next(tool for tool in result["tools"] if tool["name"] == "alpha__three")
    assert three["_meta"] == {"io.gatewayd/requiresConfirmation": True}


async def test_a_client_never_gets_another_clients_remembered_tools(lister: Any) -> None:
    listing, _state, _dir = lister
    for round_ in range(3):
        for sse in (False, True):
            for modern in (False, True):
                allowed = await listing.raw("all", round_, sse=sse, modern=modern)
                limited = await listing.raw("some", round_, sse=sse, modern=modern)
                for hidden in ("alpha__two", "alpha__three", "beta__secret", "only for all"):
                    assert hidden.encode() in allowed
                    assert hidden.encode() not in limited


async def test_a_reload_lists_the_new_tool_on_the_next_list(lister: Any) -> None:
    listing, state, config_dir = lister
    catalog = state.gateway.catalog
    for modern in (False, True):
        assert names(await listing.message("all", 1, modern=modern)) == SEEN["all"]
    principal = state.generation.principal("all")
    assert principal is not None
    remembered = await catalog.list_tools(principal, state.generation.servers)
    assert await catalog.list_tools(principal, state.generation.servers) is remembered
    (config_dir / "tools.d" / "beta.toml").write_text(python_command(str(FAULTSRV)) + BETA + "[methods.fresh]\n")
    await _reload(state)
    for modern in (False, True):
        assert names(await listing.message("all", 2, modern=modern)) == [*SEEN["all"][:3], "beta__fresh",
                                                                        *SEEN["all"][3:]]
        # A grant that does not cover it does not show it.
        assert names(await listing.message("some", 2, modern=modern)) == SEEN["some"]
    # A changed grant is a new principal: its answer is made anew too.
    (config_dir / "policies" / "roles.toml").write_text(ROLES.replace('"beta.public"]', '"beta.public", "beta.fresh"]'))
    await _reload(state)
    assert names(await listing.message("some", 3, sse=True)) == ["alpha__one", "beta__fresh", "beta__public"]


async def _reload(state: DaemonState) -> None:
    result = await Reloader(state, drain=1.0).reload("test")
    assert result.ok, result


async def test_remembered_pages_are_the_fresh_encoding_and_walk_the_whole_list(tmp_path: Path) -> None:
    servers = {"alpha": python_command(str(FAULTSRV)) + ALPHA, "beta": python_command(str(FAULTSRV)) + BETA}
    tokens = write_config(tmp_path, servers, ROLES, CLIENTS)
    async with running_stack(tmp_path, audit_path="", list_page_size=3) as (client, _state):
        listing = Lister(client, tokens)
        for modern in (False, True):
            for request_id in (5, "five"):
                first = await listing.message("all", request_id, modern=modern)
                assert names(first) == SEEN["all"][:3]
                cursor = first["result"]["nextCursor"]
                rest = await listing.message("all", request_id, sse=True, modern=modern, cursor=cursor)
                assert names(rest) == SEEN["all"][3:] and "nextCursor" not in rest["result"]
            # Another client's cursor is not this one's: the page kept for "all" is not given to "some".
            refused = await listing.raw("some", 6, modern=modern, cursor=cursor, status=400 if modern else 200)
            assert json.loads(refused)["error"]["code"] == -32602


async def test_a_childs_changed_tool_list_is_listed_next(tmp_path: Path) -> None:
    # An MCP child lists its own tools, and says when they change (faultsrv's change_tools adds `extra`).
    tokens = write_config(tmp_path, {"live": python_command(str(FAULTSRV), "--mcp")},
                          '[roles.all]\nallow = ["live.*"]\n', {"all": ["all"]})
    async with running_stack(tmp_path, audit_path="") as (client, _state):
        listing = Lister(client, tokens)
        before = names(await listing.message("all", 1))
        assert "live__echo" in before and "live__extra" not in before
        assert names(await listing.message("all", 2, modern=True)) == before
        assert "result" in await listing.call_tool("all", "live__change_tools")
        deadline = time.monotonic() + CHANGE_DEADLINE
        while "live__extra" not in (after := names(await listing.message("all", 3))):
            assert time.monotonic() < deadline, after
        assert "live__extra" in names(await listing.message("all", 4, sse=True, modern=True))
