"""The real daemon learns of its children's exits without a thread a child (upstream/process.py
`watch_exits_by_pidfd`, on Python 3.11; 3.12 does it itself): its thread count does not grow with per-session
children, and a child killed from outside is seen to exit and started again for its session's next call.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import aiohttp

from tests.daemon import Daemon, python_command, status, write_config
from tests.e2e.test_calls import initialize, tools_call
from tests.waiting import eventually, process_gone

SESSIONS = 6
# A child per session, room for every session's: shared with test_session_expiry.
PER_SESSION = python_command("-m", "gatewayd.examples.calc") + (
    f'\nprotocol = "jsonrpc"\nisolation = "session"\nmax_children_per_client = {SESSIONS}\n\n'
    '[methods.echo]\ninput_schema = { type = "object" }\n')


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


async def children(config_dir: Path) -> dict[str, int]:
    """The per-session server's children: session id shown → pid."""
    return {row["owner"]: row["pid"] for row in (await status(config_dir))["servers"]["mine"]["children"]}


async def test_children_cost_no_thread_and_a_killed_one_is_seen_and_replaced(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"mine": PER_SESSION}, '[roles.r]\nallow = ["mine.*"]\n', {"alice": ["r"]})
    # Without the config watcher, whose work in the default executor starts threads of its own at any time.
    async with Daemon(tmp_path, f"--max-sessions-per-client={SESSIONS}", "--watch-config=false") as daemon:
        assert daemon.proc is not None
        token, pid = tokens["alice"], daemon.proc.pid
        sessions = [await initialize(http, daemon.url, token) for _ in range(SESSIONS)]
        await tools_call(http, daemon.url, token, sessions[0], "mine__echo", {})
        assert len(await children(tmp_path)) == 1  # the status route starts the default executor's thread
        alone = threads(pid)
        for session in sessions[1:]:
            await tools_call(http, daemon.url, token, session, "mine__echo", {})
        running = await children(tmp_path)
        assert len(running) == SESSIONS
        assert threads(pid) == alone, "a thread a child"
        [(owner, killed)] = [(owner, child) for owner, child in running.items() if sessions[0].startswith(owner)]
        os.kill(killed, signal.SIGKILL)
        await eventually(lambda: process_gone(killed), what="the killed child is reaped")
        await daemon.wait_log(rf"pid={killed} exited: killed by signal SIGKILL")
        # The daemon saw the exit: the session's next call runs on a new child.
        answer = await tools_call(http, daemon.url, token, sessions[0], "mine__echo", {"n": 1})
        assert answer["result"]["structuredContent"] == {"n": 1}
        replaced = (await children(tmp_path))[owner]
        assert replaced != killed and threads(pid) == alone
