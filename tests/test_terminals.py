"""An agent's terminals (gatewayd/terminals.py), with real processes: output kept to its limit at a character
boundary, exit statuses, the per-turn limit crossed, and nothing left running when the turn ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gatewayd import terminals
from gatewayd.errors import InvalidParams, Overloaded
from gatewayd.terminals import Terminals
from tests.waiting import eventually, process_gone


@pytest.fixture
async def turn() -> AsyncIterator[Terminals]:
    made = Terminals()
    yield made
    await made.close()


async def test_output_is_kept_to_its_limit_from_the_end_at_a_character_boundary(turn: Terminals) -> None:
    made = await turn.create({"command": "printf", "args": ["abc\u00e9\u00e9"], "outputByteLimit": 4})
    status = await turn.handle("terminal/wait_for_exit", made)
    out = await turn.handle("terminal/output", made)
    assert status == {"exitCode": 0, "signal": None}
    # "é" is two bytes: the last 4 bytes are "éé"; a cut inside a character would start one byte later.
    assert out == {"output": "\u00e9\u00e9", "truncated": True, "exitStatus": {"exitCode": 0, "signal": None}}


async def test_a_killed_terminal_says_its_signal(turn: Terminals) -> None:
    made = await turn.create({"command": "sleep", "args": ["30"]})
    await turn.handle("terminal/kill", made)
    assert await turn.handle("terminal/wait_for_exit", made) == {"exitCode": None, "signal": "SIGKILL"}


async def test_a_turn_holds_at_most_its_terminals(turn: Terminals) -> None:
    made = [await turn.create({"command": "true"}) for _ in range(terminals.MAX_TERMINALS)]
    with pytest.raises(Overloaded, match="release one first"):
        await turn.create({"command": "true"})
    await turn.handle("terminal/release", made[0])
    await turn.create({"command": "true"})
    with pytest.raises(InvalidParams, match="unknown terminal"):
        await turn.handle("terminal/output", made[0])


async def test_bad_commands_are_clear_errors(turn: Terminals) -> None:
    with pytest.raises(InvalidParams, match="No such file"):
        await turn.create({"command": "/no/such/program"})
    with pytest.raises(InvalidParams, match="absolute"):
        await turn.create({"command": "true", "cwd": "relative"})


async def test_the_turn_s_end_leaves_nothing_running(tmp_path: Path) -> None:
    turn = Terminals()
    pid_file = tmp_path / "grandchild"
    await turn.create({"command": "sh", "args": ["-c", f"sleep 60 & echo $! > {pid_file}; wait"]})
    await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "", what="the grandchild started")
    grandchild = int(pid_file.read_text())
    await turn.close()
    await eventually(lambda: process_gone(grandchild), what="the terminal's grandchild is gone")


async def test_a_set_counts_what_runs_and_kill_signals_every_group_at_once(turn: Terminals) -> None:
    first = await turn.create({"command": "sleep", "args": ["30"]})
    await turn.create({"command": "sleep", "args": ["30"]})
    done = await turn.create({"command": "true"})
    await turn.handle("terminal/wait_for_exit", done)
    assert (len(turn), turn.running()) == (3, 2)
    # No wait in between: the signals are sent before kill returns, so a close cut short has still ended them.
    turn.kill()
    assert await turn.handle("terminal/wait_for_exit", first) == {"exitCode": None, "signal": "SIGKILL"}
    await eventually(lambda: turn.running() == 0, what="both sleeps ended")
