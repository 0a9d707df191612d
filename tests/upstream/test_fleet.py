"""Per-client and per-session children (gatewayd/upstream/fleet.py), with real child processes (faultsrv).

One child per owner and never another owner's; a session's child stops when the session ends; a session server
refuses calls outside a session; every limit (per server, per client, the daemon's budget) is crossed, with the
children that hold nothing let go first; reload retirement, admin restart and status cover every child.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd.config.loader import ConfigInvalid, load_snapshot
from gatewayd.config.models import ServerConfig
from gatewayd.errors import InvalidRequest, Overloaded, ToolServerUnavailable
from gatewayd.explain import explain
from gatewayd.sessions import Session
from gatewayd.upstream.api import Delivery
from gatewayd.upstream.fleet import ChildBudget, Fleet
from gatewayd.upstream.process import STDERR_TAIL_LINES, _StderrLog
from gatewayd.upstream.server import State
from tests.daemon import FAULTSRV, faultsrv_command, write_config
from tests.upstream.test_supervision import FAULT_METHODS
from tests.waiting import eventually, process_gone


def fleet(tmp_path: Path, isolation: str, budget: int = 64, **config: Any) -> Fleet:
    fields: dict[str, Any] = {"command": [sys.executable, str(FAULTSRV)], "protocol": "jsonrpc", "idle_timeout": 0,
                              "methods": FAULT_METHODS, "isolation": isolation, **config}
    return Fleet("fault", ServerConfig.model_validate(fields), tmp_path, ChildBudget(budget))


SESSION_NUMBERS = itertools.count(1)


def session(client: str = "a") -> Session:
    return Session(id=f"{client}-session-{next(SESSION_NUMBERS)}", client=client, protocol_version="2025-11-25",
                   capabilities={}, client_info={})


def by(client: str, owner: Session | None = None) -> Delivery:
    return Delivery(client, session=owner)


@pytest.fixture
async def fleets() -> AsyncIterator[list[Fleet]]:
    made: list[Fleet] = []
    yield made
    await asyncio.gather(*(one.stop() for one in made))


async def pid(server: Fleet, delivery: Delivery) -> int:
    return int(await server.call_method("pid", {}, delivery))


async def test_each_client_has_its_own_child(tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "client")
    fleets.append(server)
    first, again, other = await pid(server, by("a")), await pid(server, by("a")), await pid(server, by("b"))
    assert first == again and first != other
    rows = server.status()["children"]
    assert {(row["owner"], row["pid"]) for row in rows} == {("a", first), ("b", other)}
    assert server.state is State.RUNNING and server.status()["isolation"] == "client"


async def test_each_session_has_its_own_child_which_stops_when_the_session_ends(
        tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "session")
    fleets.append(server)
    one, two = session("a"), session("a")
    first, second = await pid(server, by("a", one)), await pid(server, by("a", two))
    assert first != second and await pid(server, by("a", one)) == first
    one.end()
    await eventually(lambda: process_gone(first), what="the ended session's child exits")
    assert [row["pid"] for row in server.status()["children"]] == [second]
    assert await pid(server, by("a", two)) == second


async def test_a_session_server_refuses_a_call_outside_a_session(tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "session")
    fleets.append(server)
    with pytest.raises(InvalidRequest, match="one child per MCP session"):
        await server.call_method("pid", {}, by("a"))


async def test_one_client_cannot_have_more_children_than_its_share(tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "session", max_children=3, max_children_per_client=2)
    fleets.append(server)
    await pid(server, by("a", session("a")))
    await pid(server, by("a", session("a")))
    with pytest.raises(Overloaded, match="max_children_per_client") as refused:
        await pid(server, by("a", session("a")))
    assert refused.value.code == -32014
    await pid(server, by("b", session("b")))
    with pytest.raises(Overloaded, match=r"runs 3 children \(max_children\)"):
        await pid(server, by("c", session("c")))


async def test_the_daemon_s_budget_bounds_children_across_servers(tmp_path: Path, fleets: list[Fleet]) -> None:
    budget = ChildBudget(2)
    config = {"command": [sys.executable, str(FAULTSRV)], "protocol": "jsonrpc", "idle_timeout": 0,
              "methods": FAULT_METHODS, "isolation": "client"}
    one = Fleet("one", ServerConfig.model_validate(config), tmp_path, budget)
    two = Fleet("two", ServerConfig.model_validate(config), tmp_path, budget)
    fleets.extend((one, two))
    await pid(one, by("a"))
    await pid(two, by("a"))
    with pytest.raises(Overloaded, match="max_isolated_children"):
        await pid(one, by("b"))
    await one.stop()
    assert budget.used == 1  # two's child is still there
    await pid(two, by("b"))


async def test_children_that_hold_nothing_are_let_go_to_make_room(tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "client", max_children=1, max_children_per_client=1)
    fleets.append(server)
    first = await pid(server, by("a"))
    [child] = server.processes[1:]
    await child.stop()  # as an idle timeout would
    assert await pid(server, by("b")) != first
    assert [row["owner"] for row in server.status()["children"]] == ["b"]


async def test_retire_and_restart_cover_every_child(tmp_path: Path, fleets: list[Fleet]) -> None:
    server = fleet(tmp_path, "client")
    fleets.append(server)
    pids = [await pid(server, by("a")), await pid(server, by("b"))]
    await server.restart()
    assert all(process_gone(each) for each in pids) and not server.status()["children"]
    assert await pid(server, by("a")) not in pids
    await server.retire("was changed by a config reload", drain=1.0)
    assert not server.status()["children"]
    with pytest.raises(ToolServerUnavailable, match="was changed by a config reload"):
        await pid(server, by("a"))


def test_a_client_s_share_cannot_exceed_the_server_s_children() -> None:
    with pytest.raises(ValueError, match="max_children_per_client cannot be more than max_children"):
        ServerConfig.model_validate({"command": ["x"], "isolation": "client", "max_children": 2,
                                     "max_children_per_client": 3})


def test_explain_says_a_server_runs_a_child_per_session(tmp_path: Path) -> None:
    write_config(tmp_path, {"mine": faultsrv_command() + '\nisolation = "session"\n',
                            "ours": faultsrv_command()}, '[roles.r]\nallow = ["mine.*", "ours.*"]\n', {"c": ["r"]})
    snapshot = load_snapshot(tmp_path)
    assert '  runs on a child of its own for each session (isolation = "session")' in explain(
        snapshot, "c", "mine.tool", None)
    assert not any("child of its own" in line for line in explain(snapshot, "c", "ours.tool", None))


def test_an_unknown_isolation_is_a_config_error_naming_file_and_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"mine": faultsrv_command() + '\nisolation = "process"\n'}, "", {})
    with pytest.raises(ConfigInvalid) as error:
        load_snapshot(tmp_path)
    assert "tools.d/mine.toml" in str(error.value) and "isolation" in str(error.value)


async def test_an_owner_s_child_passes_on_only_what_concerns_its_owner(tmp_path: Path, fleets: list[Fleet]) -> None:
    tools_changed: list[str] = []
    events: list[str] = []
    config = {"command": [sys.executable, str(FAULTSRV)], "protocol": "jsonrpc", "idle_timeout": 0,
              "methods": FAULT_METHODS, "isolation": "client"}
    server = Fleet("fault", ServerConfig.model_validate(config), tmp_path, ChildBudget(4), tools_changed.append,
                   on_surface_event=lambda _name, message: events.append(str(message["method"])))
    fleets.append(server)
    await pid(server, by("a"))
    [child] = server.processes[1:]
    # As the child's own stdout would deliver them (Connection → ToolServer._on_notification).
    for method in ("notifications/tools/list_changed", "notifications/resources/list_changed",
                   "notifications/prompts/list_changed", "notifications/resources/updated",
                   "notifications/tasks/status"):
        child._on_notification({"jsonrpc": "2.0", "method": method, "params": {"uri": "x://y", "taskId": "t"}})
    assert tools_changed == []
    assert events == ["notifications/resources/updated", "notifications/tasks/status"]


def test_a_child_s_stderr_tail_puts_error_lines_and_tracebacks_first() -> None:
    log = _StderrLog("t", 1)
    for index in range(30):
        log.line(f"INFO chatter {index}")
        if index == 10:
            log.line("Traceback (most recent call last):")
            log.line('  File "agent.py", line 3, in <module>')
            log.line("ValueError: bad input")
    tail = log.tail()
    assert tail[:3] == ("Traceback (most recent call last):", '  File "agent.py", line 3, in <module>',
                        "ValueError: bad input")
    assert len(tail) == STDERR_TAIL_LINES and tail[-1] == "INFO chatter 29"


async def test_a_session_server_s_count_of_calls_that_waited_keeps_those_of_ended_sessions(
        tmp_path: Path, fleets: list[Fleet]) -> None:
    # The count is a Prometheus counter (gatewayd_server_calls_queued_total): a child going away with its session
    # must not take its calls out of it.
    server = fleet(tmp_path, "session", max_in_flight=1)
    fleets.append(server)
    owner = session("a")
    sleeping = asyncio.create_task(server.call_method("sleep", {"seconds": 0.3}, by("a", owner)))
    await eventually(lambda: server.status()["in_flight"] == 1, what="the sleep holds the child's one slot")
    await asyncio.gather(sleeping, pid(server, by("a", owner)))
    assert server.status()["queued_total"] == 1 and server.status()["waiting"] == 0
    owner.end()
    await eventually(lambda: not server.status()["children"], what="the ended session's child is let go")
    assert server.status()["queued_total"] == 1


def test_a_fleets_task_modes_and_deadlines_are_its_servers_under_the_dialects_names(tmp_path: Path) -> None:
    # An ACP agent's `prompt` tool is configured as `[methods."session/prompt"]`: a fleet reads it as its servers do.
    config = ServerConfig.model_validate({
        "command": ["true"], "protocol": "acp", "isolation": "session",
        "methods": {"session/prompt": {"task": "optional", "timeout": "20m"}}})
    fleet = Fleet("agent", config, tmp_path, ChildBudget(4))
    assert (fleet.task_mode("prompt"), fleet.deadline_for("prompt")) == ("optional", 1200.0)
    assert (fleet.task_mode("other"), fleet.deadline_for("other")) == ("never", config.call_timeout)
