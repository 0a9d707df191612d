"""The gateway's own pages, through the real pipeline in memory: every list it answers, cut across servers.

Three scripted servers, a page of 4; paging any list to its end gives exactly the one-page list, in order, with
nothing repeated or skipped, and never anything the client may not use. A cursor is the client's and the list's
it was made for; it survives a change of the list without giving an item twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd.calls import CallContext
from gatewayd.gateway import Gateway
from gatewayd.jsonrpc import Request
from gatewayd.paging import ITEMS, Pager
from gatewayd.policy import Grant, Principal
from gatewayd.upstream.api import Upstream
from tests.test_gateway import Scripted, in_memory_gateway

PAGE = 4
EVERYONE = Principal("all", (Grant("all", "p.toml", allow=("*",)),))
# May use b and c only, and of c only its tools t1 and t3.
SOME = Principal("some", (Grant("some", "p.toml", allow=("b.*", "c.t1", "c.t3")),))
LISTS = [method for method in ITEMS if method != "tasks/list"]


def _server(name: str, count: int) -> Scripted:
    server = Scripted(name, [f"t{index}" for index in range(count)])
    server.surfaces = {
        "resources": [{"uri": f"{name}://r{index}", "name": f"r{index}"} for index in range(count)],
        "resourceTemplates": [{"uriTemplate": f"{name}://x{index}/{{id}}", "name": f"x{index}"}
                              for index in range(count)],
        "prompts": [{"name": f"p{index}"} for index in range(count)],
    }
    return server


class Rig:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.servers = {"a": _server("a", 5), "b": _server("b", 3), "c": _server("c", 6)}

    async def ask(self, method: str, params: Any = None, principal: Principal = EVERYONE) -> dict[str, Any]:
        servers: dict[str, Upstream] = dict(self.servers)
        return await self.gateway.dispatch(CallContext(principal, servers), Request(1, method, params))

    async def walk(self, method: str, principal: Principal = EVERYONE) -> tuple[list[Any], int]:
        """Every item of `method`'s list, page by page, and how many pages it took."""
        key, _ = ITEMS[method]
        items: list[Any] = []
        cursor, pages = None, 0
        while True:
            answer = await self.ask(method, {"cursor": cursor} if cursor is not None else {}, principal)
            result = answer["result"]
            pages += 1
            assert len(result[key]) <= PAGE
            items += result[key]
            cursor = result.get("nextCursor")
            if cursor is None:
                return items, pages


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with in_memory_gateway(tmp_path / "audit.jsonl") as (gateway, _):
        yield Rig(gateway)


def _one_page(gateway: Gateway) -> None:
    gateway.pager = Pager(1000, key=gateway.pager._key)


@pytest.mark.parametrize("method", LISTS)
@pytest.mark.parametrize("principal", [EVERYONE, SOME], ids=["everyone", "some"])
async def test_paging_gives_exactly_the_one_page_list(rig: Rig, method: str, principal: Principal) -> None:
    rig.gateway.pager = Pager(PAGE)
    paged, pages = await rig.walk(method, principal)
    _one_page(rig.gateway)
    whole = (await rig.ask(method, None, principal))["result"]
    assert "nextCursor" not in whole
    assert paged == whole[ITEMS[method][0]]
    assert pages == max(1, -(-len(paged) // PAGE))
    names = [str(item[ITEMS[method][1]]) for item in paged]
    assert len(set(names)) == len(names)
    if principal is SOME:
        # Nothing of a, and of c only what the grant names (c's tools t1 and t3; nothing else of c).
        assert not any(name.startswith(("a__", "a://")) for name in names)
        expected = {"tools/list": ["b__t0", "b__t1", "b__t2", "c__t1", "c__t3"]}.get(method)
        if expected is not None:
            assert names == expected


async def test_a_list_that_fits_is_answered_as_made(rig: Rig) -> None:
    rig.gateway.pager = Pager(14)
    answer = (await rig.ask("tools/list"))["result"]
    assert len(answer["tools"]) == 14 and "nextCursor" not in answer
    rig.gateway.pager = Pager(13)
    assert (await rig.ask("tools/list"))["result"]["nextCursor"]


async def test_a_cursor_survives_a_change_of_the_list_without_giving_an_item_twice(rig: Rig) -> None:
    rig.gateway.pager = Pager(PAGE)
    first = (await rig.ask("tools/list"))["result"]
    assert [tool["name"] for tool in first["tools"]] == ["a__t0", "a__t1", "a__t2", "a__t3"]
    rig.servers["a"].tools_offered.remove("a__t1".removeprefix("a__"))  # an item already given goes away
    rig.servers["a"].tools_offered.insert(0, "t00")  # and one sorts before everything given so far
    second = (await rig.ask("tools/list", {"cursor": first["nextCursor"]}))["result"]
    assert [tool["name"] for tool in second["tools"]] == ["a__t4", "b__t0", "b__t1", "b__t2"]
    rig.servers["a"].tools_offered.remove("t4")  # the very item the cursor names goes away: its place stands
    third = (await rig.ask("tools/list", {"cursor": second["nextCursor"]}))["result"]
    assert [tool["name"] for tool in third["tools"]] == ["c__t0", "c__t1", "c__t2", "c__t3"]


@pytest.mark.parametrize("cursor", ["", "x", "A" * 38, "!" * 38, None])
async def test_a_cursor_the_gateway_did_not_make_is_invalid_params(rig: Rig, cursor: str | None) -> None:
    rig.gateway.pager = Pager(PAGE)
    if cursor is None:  # one made for another client, and one made for another list
        made = (await rig.ask("tools/list"))["result"]["nextCursor"]
        answers = [await rig.ask("tools/list", {"cursor": made}, SOME), await rig.ask("prompts/list", {"cursor": made})]
    else:
        answers = [await rig.ask(method, {"cursor": cursor}) for method in ITEMS]
    for answer in answers:
        assert answer["error"]["code"] == -32602
        assert answer["error"]["message"].startswith("Invalid cursor: send back a nextCursor")
    assert (await rig.ask("tools/list", {"cursor": 3}))["error"]["code"] == -32602


async def test_a_cursor_from_before_a_restart_is_invalid(rig: Rig) -> None:
    rig.gateway.pager = Pager(PAGE)
    made = (await rig.ask("tools/list"))["result"]["nextCursor"]
    rig.gateway.pager = Pager(PAGE)  # a new process makes a new key
    assert (await rig.ask("tools/list", {"cursor": made}))["error"]["code"] == -32602


async def test_tasks_list_pages_the_clients_own_tasks_newest_last(rig: Rig) -> None:
    rig.gateway.pager = Pager(PAGE)
    made = []
    for index in range(10):
        client = "all" if index % 3 else "some"
        task = {"taskId": f"child-{index}", "status": "working"}
        made.append((client, rig.gateway.tasks.created("a", "t0", {}, client, None, {"task": task}, task)))
    mine = [answer["task"]["taskId"] for client, answer in made if client == "all"]
    listed, pages = await rig.walk("tasks/list")
    assert [task["taskId"] for task in listed] == mine and pages == 2
