"""ACP agents behind the real daemon: a real agent on the official ACP SDK (tests/fixtures/acpagent.py).

Two clients each get their own agent process and conversation; a session one client opened does not exist for
the other; a turn's updates stream to its caller in order; a turn that keeps reporting runs past the server's
call timeout and a silent one ends; the agent's permission request is approved with `gatewayctl`, denied on the
web page's API, and answered by the caller's own user through MCP elicitation (the `prompt` tool); file reads
and writes are served under the caller's `path_under` rule; `terminal/*` is refused; a terminal ends with the turn
that made it, or (`terminal_lifetime = "session"`) is there for the session's later turns, keeps its agent from
idling out until released, and ends with its agent or its session's close; a client lists, configures, closes
and resumes its own sessions only; what an agent says between turns comes with the next, and what it asks between
turns is decided for the session's client (a permission by an operator on gatewayctl or the web page, files under
the client's path rule, a new terminal only where terminals are the session's) until the session ends; an agent
that exits mid-turn fails the turn at once with its exit status; a session's agent stops when the session ends; no
agent process survives the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult

from gatewayd.tokens import hash_token, new_token
from gatewayd.upstream.acp import MAX_HELD_UPDATES
from tests.daemon import REPO, Daemon, gatewayctl, headers, pending_approvals, python_command, rpc, write_config
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, bearer, sse_messages
from tests.waiting import POLL_INTERVAL, eventually, process_gone

pytestmark = pytest.mark.asyncio(loop_scope="module")

AGENT: Final = REPO / "tests" / "fixtures" / "acpagent.py"
SSE: Final = {"Accept": "application/json, text/event-stream"}


@dataclass
class Rig:
    daemon: Daemon
    root: Path
    tokens: dict[str, str]
    operator: str

    @property
    def url(self) -> str:
        return self.daemon.url

    async def call(self, http: aiohttp.ClientSession, client: str, method: str, params: Any) -> dict[str, Any]:
        return await rpc(http, self.url, self.tokens[client], method, params)

    async def turn(self, http: aiohttp.ClientSession, client: str, session: str, text: str) -> dict[str, Any]:
        return await self.turn_on(http, client, "coder", session, text)

    async def turn_on(self, http: aiohttp.ClientSession, client: str, server: str, session: str,
                      text: str) -> dict[str, Any]:
        return await self.call(http, client, f"{server}.session/prompt",
                               {"sessionId": session, "prompt": [{"type": "text", "text": text}]})

    async def said(self, http: aiohttp.ClientSession, client: str, session: str, text: str,
                   server: str = "coder") -> list[str]:
        """What the agent says in a turn, from the updates streamed to the caller, in order (then the result)."""
        body = {"jsonrpc": "2.0", "id": 7, "method": f"{server}.session/prompt",
                "params": {"sessionId": session, "prompt": [{"type": "text", "text": text}]}}
        async with http.post(self.url, json=body, headers=headers(self.tokens[client], **SSE)) as response:
            assert response.status == 200
            messages = sse_messages(await response.text())
        *updates, answer = messages
        assert answer["result"] == {"stopReason": "end_turn"}, answer
        return [update["params"]["update"]["content"]["text"] for update in updates
                if update.get("method") == "session/update"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("acp")
    (root / "work").mkdir()
    (root / "work" / "notes.txt").write_text("hello from the notes\nsecond line\n")
    (root / "secret.txt").write_text("not for agents")
    agent = python_command(str(AGENT)) + '\nprotocol = "acp"\ncall_timeout = "2s"\n' \
        '[methods."session/prompt"]\ntimeout = "60s"\nactivity_timeout = "1.5s"\n'
    roles = f'''
[roles.dev]
allow = ["coder.session/*", "coder.prompt", "coder.fs/read_text_file", "coder.fs/write_text_file", "mate.*",
         "pool.session/*",
         "runner.session/*", "keeper.session/*", "keeper.terminal/create"]
confirm = ["coder.session/request_permission", "mate.session/request_permission", "runner.terminal/create"]
[roles.dev.args."runner.terminal/create".command]
one_of = ["echo", "sh"]
[roles.dev.args."keeper.terminal/create".command]
one_of = ["sh"]
[roles.dev.confirmation."*.session/request_permission"]
timeout = "20s"
channels = ["client", "web"]
[roles.dev.args."*.fs/*_text_file".path]
path_under = "{root / "work"}"
'''
    tokens = write_config(root, {"coder": agent.replace('call_timeout', 'isolation = "client"\ncall_timeout', 1),
                                 "mate": agent.replace('call_timeout', 'isolation = "session"\ncall_timeout', 1),
                                 "pool": agent,
                                 "runner": agent.replace('call_timeout', 'terminals = true\ncall_timeout', 1),
                                 "keeper": agent.replace('call_timeout', 'terminals = true\nterminal_lifetime = '
                                                         '"session"\nidle_timeout = "1s"\ncall_timeout', 1)},
                          roles, {"alice": ["dev"], "bob": ["dev"]})
    operator = new_token()
    (root / "policies" / "operators.toml").write_text(f'[operators.ops]\ntoken_sha256 = "{hash_token(operator)}"\n')
    async with Daemon(root) as running:
        yield Rig(running, root, tokens, operator)


async def new_session(rig: Rig, http: aiohttp.ClientSession, client: str, server: str = "coder") -> str:
    answer = await rig.call(http, client, f"{server}.session/new", {"cwd": str(rig.root / "work"), "mcpServers": []})
    return str(answer["result"]["sessionId"])


async def test_each_client_has_its_own_agent_and_conversation(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        alice, bob = await new_session(rig, http, "alice"), await new_session(rig, http, "bob")
        alice_pid = await rig.said(http, "alice", alice, "pid")
        bob_pid = await rig.said(http, "bob", bob, "pid")
        again = await rig.said(http, "alice", alice, "count")
        # Bob cannot drive, cancel or load Alice's session: for him it does not exist.
        stolen = await rig.turn(http, "bob", alice, "echo hi")
        cancel = await rig.call(http, "bob", "coder.session/cancel", {"sessionId": alice})
    assert alice_pid != bob_pid and again == ["2"]
    assert stolen["error"]["code"] == cancel["error"]["code"] == -32602
    assert "unknown session" in stolen["error"]["message"]


async def test_on_a_shared_agent_a_session_belongs_to_the_client_that_opened_it(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        opened = await rig.call(http, "alice", "pool.session/new", {"cwd": str(rig.root), "mcpServers": []})
        session = opened["result"]["sessionId"]
        mine = await rig.call(http, "alice", "pool.session/prompt",
                              {"sessionId": session, "prompt": [{"type": "text", "text": "echo mine"}]})
        theirs = await rig.call(http, "bob", "pool.session/prompt",
                                {"sessionId": session, "prompt": [{"type": "text", "text": "echo theirs"}]})
        missing = await rig.call(http, "bob", "pool.session/prompt",
                                 {"sessionId": "sess-404", "prompt": [{"type": "text", "text": "echo theirs"}]})
    assert mine["result"] == {"stopReason": "end_turn"}
    assert theirs["error"]["code"] == -32602
    assert _without_names(theirs["error"]) == _without_names(missing["error"])


def _without_names(error: dict[str, Any]) -> dict[str, Any]:
    return {**error, "message": error["message"].split("'")[0]}


async def test_a_turn_s_updates_stream_in_order(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        said = await rig.said(http, "alice", session, "report 4 0.05")
    assert said == [f"tick {index} " for index in range(4)]


async def test_a_turn_that_keeps_reporting_runs_past_the_call_timeout_and_a_silent_one_ends(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        # 3 s of ticks a second apart: past call_timeout (2 s), within activity_timeout (1.5 s) of each tick.
        said = await rig.said(http, "alice", session, "report 3 1")
        silent = await rig.turn(http, "alice", session, "silent 4")
    assert said == ["tick 0 ", "tick 1 ", "tick 2 "]
    assert silent["error"]["code"] == -32012 and silent["error"]["data"]["silent"] is True


async def test_a_permission_is_approved_with_gatewayctl_and_denied_on_the_web_page(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        asking = asyncio.ensure_future(rig.said(http, "alice", session, "permission"))
        [pending] = await pending_approvals(rig.root)
        assert pending["method"] == "coder.session/request_permission"
        assert "rm -rf build" in json.dumps(pending["arguments"]) and "allow_always" in json.dumps(pending["arguments"])
        code, _, err = await gatewayctl(rig.root, "approve", pending["id"])
        assert code == 0, err
        approved = await asyncio.wait_for(asking, 20)
        asking = asyncio.ensure_future(rig.said(http, "alice", session, "permission"))
        [pending] = await pending_approvals(rig.root)
        async with http.post(f"{rig.url.removesuffix('/mcp')}/approvals/api/{pending['id']}/deny",
                             headers={"Authorization": f"Bearer {rig.operator}"}) as response:
            assert response.status == 200, await response.text()
        denied = await asyncio.wait_for(asking, 20)
    assert approved == ["chose yes"] and denied == ["chose no"]


async def test_files_are_served_under_the_caller_s_path_rule_and_terminals_refused(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        inside = await rig.said(http, "alice", session, f"read {rig.root / 'work' / 'notes.txt'}")
        outside = await rig.said(http, "alice", session, f"read {rig.root / 'secret.txt'}")
        escape = await rig.said(http, "alice", session, f"read {rig.root / 'work' / '..' / 'secret.txt'}")
        wrote = await rig.said(http, "alice", session, f"write {rig.root / 'work' / 'out.txt'} made by the agent")
        terminal = await rig.said(http, "alice", session, "terminal")
    assert inside == ["read hello from the notes\nsecond line\n"]
    assert outside[0].startswith("error -32602") and escape[0].startswith("error -32602")
    assert "not for agents" not in outside[0] + escape[0]
    assert wrote == ["written"] and (rig.root / "work" / "out.txt").read_text() == "made by the agent"
    assert terminal[0].startswith("error -32601")


async def test_what_an_agent_asks_in_a_turn_is_audited_under_the_turn_s_trace_and_between_turns_apart(
        rig: Rig) -> None:
    notes = rig.root / "work" / "notes.txt"

    def turns() -> list[dict[str, Any]]:
        return audited(rig, method="coder.session/prompt", client="bob", event="outcome")

    def reads() -> list[dict[str, Any]]:
        return audited(rig, method="coder.fs/read_text_file", client="bob", event="outcome")

    before = len(turns()), len(reads())
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "bob")
        await rig.said(http, "bob", session, f"read {notes}")
        await rig.turn(http, "bob", session, f"afterwards read {notes}")
        await held(rig, "coder", session, 1)
    await eventually(lambda: (len(turns()), len(reads())) == (before[0] + 2, before[1] + 2),
                     what="both turns and both reads audited")
    asked, quiet = turns()[before[0]:]
    during, between = reads()[before[1]:]
    assert during["trace_id"] == asked["trace_id"]
    assert between["trace_id"] not in (asked["trace_id"], quiet["trace_id"])


async def test_a_terminal_runs_only_what_the_policy_allows_once_a_person_confirms_it(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice", "runner")
        running = asyncio.ensure_future(rig.said(http, "alice", session, "terminal sh -c echo${IFS}out;exit${IFS}4",
                                                 "runner"))
        [pending] = await pending_approvals(rig.root)
        assert pending["method"] == "runner.terminal/create" and pending["arguments"]["command"] == "sh"
        code, _, err = await gatewayctl(rig.root, "approve", pending["id"])
        assert code == 0, err
        ran = await asyncio.wait_for(running, 20)
        refused = await rig.said(http, "alice", session, "terminal rm -rf /nothing", "runner")
    assert ran == ["exit 4 output 'out\\n'"]
    # Outside the rule: refused before anyone is asked, naming the rule.
    assert refused[0].startswith("error -32602") and "one_of" in refused[0]


def background(pid_file: Path) -> str:
    """A prompt that starts a command writing "started" and then its pid to `pid_file`, and keeps running."""
    return f"background sh -c echo${{IFS}}started;echo${{IFS}}$$>{pid_file};exec${{IFS}}sleep${{IFS}}60"


def pid_in(pid_file: Path) -> int | None:
    text = pid_file.read_text().strip() if pid_file.exists() else ""
    return int(text) if text else None


async def started(pid_file: Path) -> int:
    await eventually(lambda: pid_in(pid_file) is not None, what="the command started")
    pid = pid_in(pid_file)
    assert pid is not None
    return pid


async def peeked(rig: Rig, http: aiohttp.ClientSession, session: str, terminal: str, want: str) -> list[str]:
    """What the agent says of `terminal` in a new turn, once that says `want` (its output is read as it comes)."""
    deadline = asyncio.get_running_loop().time() + 10
    while want not in (said := await rig.said(http, "alice", session, f"peek {terminal}", "keeper"))[0]:
        assert asyncio.get_running_loop().time() < deadline, said
        await asyncio.sleep(POLL_INTERVAL)
    return said


async def test_a_turn_s_terminal_ends_with_the_turn(rig: Rig) -> None:
    pid_file = rig.root / "turn.pid"
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice", "runner")
        running = asyncio.ensure_future(rig.said(http, "alice", session, background(pid_file), "runner"))
        [pending] = await pending_approvals(rig.root)
        code, _, err = await gatewayctl(rig.root, "approve", pending["id"])
        assert code == 0, err
        made = await asyncio.wait_for(running, 20)
        pid = await started(pid_file)
        await eventually(lambda: process_gone(pid), what="the turn's terminal is killed when the turn ends")
        later = await rig.said(http, "alice", session, "peek term-1", "runner")
    assert made == ["made term-1"]
    assert later[0].startswith("error -32602") and "unknown terminal" in later[0]


async def test_a_session_s_terminal_outlives_its_turn_and_keeps_its_agent_until_released(rig: Rig) -> None:
    pid_file = rig.root / "kept.pid"
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice", "keeper")
        agent = session.rsplit("-", 1)[1]
        made = await rig.said(http, "alice", session, background(pid_file), "keeper")
        pid = await started(pid_file)
        peek = await peeked(rig, http, session, "term-1", "started")
        # Idle for longer than its idle_timeout (1 s), with a command of its session running: kept.
        await rig.daemon.wait_log(rf"server=keeper gen=\d+ pid={agent} idle for 1s, kept: 1 terminal")
        assert not process_gone(pid)
        code, status, err = await gatewayctl(rig.root, "status")
        assert code == 0, err
        assert "keeper runs on while idle: 1 terminal(s) its sessions keep still run" in status
        released = await rig.said(http, "alice", session, "release term-1", "keeper")
        await eventually(lambda: process_gone(pid), what="the released terminal's command ends")
        await rig.daemon.wait_log(rf"server=keeper gen=\d+ pid={agent} idle for 1s, stopping")
    assert made == ["made term-1"] and peek == ["output 'started\\n' exit running"] and released == ["released"]


async def test_between_turns_an_agent_checks_on_a_terminal_its_session_keeps(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice", "keeper")
        command = "sh -c echo${IFS}started;sleep${IFS}0.3;echo${IFS}done"
        made = await rig.said(http, "alice", session, f"background {command}", "keeper")
        # The turn ends at once; the agent then waits for the command's exit and reads its output, outside any turn,
        # and says so (held for the session's next turn).
        watching = await rig.turn_on(http, "alice", "keeper", session, "watch term-1")
        await rig.daemon.wait_log(rf"server=keeper session {session[:16]}… terminal/wait_for_exit between turns")
        await rig.daemon.wait_log(rf"server=keeper session {session[:16]}… agent_message_chunk between turns: held")
        then = await rig.said(http, "alice", session, "release term-1", "keeper")
    assert made == ["made term-1"] and watching["result"] == {"stopReason": "end_turn"}
    assert then == ["watched exit 0 output 'started\\ndone\\n'", "released"]


def audited(rig: Rig, **fields: str) -> list[dict[str, Any]]:
    """The audit log's records with these fields, oldest first."""
    records = [json.loads(line) for line in (rig.root / "audit.jsonl").read_text().splitlines()]
    return [record for record in records if all(record.get(key) == value for key, value in fields.items())]


async def held(rig: Rig, server: str, session: str, count: int) -> None:
    """Wait until the agent said `count` things of `session` between its turns in all (held for its next turn)."""
    line = f"server={server} session {session[:16]}… agent_message_chunk between turns: held"
    await eventually(lambda: sum(line in logged for logged in rig.daemon.logs) >= count,
                     what=f"{count} updates of {session} between turns")


async def test_between_turns_a_permission_waits_for_a_person_on_gatewayctl_or_the_web_page(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        await rig.turn(http, "alice", session, "afterwards permission")
        # Nobody waits on a call to be asked: the person is the operator, on gatewayctl and the web page.
        [pending] = await pending_approvals(rig.root)
        await rig.daemon.wait_log(rf"server=coder session {session[:16]}… session/request_permission between "
                                  r"turns: decided for client=alice")
        code, _, err = await gatewayctl(rig.root, "approve", pending["id"])
        assert code == 0, err
        await held(rig, "coder", session, 1)
        approved = await rig.said(http, "alice", session, "afterwards permission")
        [denied_one] = await pending_approvals(rig.root)
        async with http.post(f"{rig.url.removesuffix('/mcp')}/approvals/api/{denied_one['id']}/deny",
                             headers={"Authorization": f"Bearer {rig.operator}"}) as response:
            assert response.status == 200, await response.text()
        await held(rig, "coder", session, 2)
        denied = await rig.said(http, "alice", session, "echo now")
    assert pending["method"] == "coder.session/request_permission" and pending["client"] == "alice"
    assert set(pending["channels"]) == {"gatewayctl", "web"}  # no caller's user to elicit
    assert approved == ["chose yes"] and denied == ["chose no", "now"]


async def test_between_turns_files_are_decided_for_the_session_s_client(rig: Rig) -> None:

    def bobs_reads() -> list[dict[str, Any]]:
        return audited(rig, method="coder.fs/read_text_file", client="bob", route="agent")

    before = len(bobs_reads())
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "bob")
        await rig.turn(http, "bob", session, f"afterwards read {rig.root / 'work' / 'notes.txt'}")
        await held(rig, "coder", session, 1)
        inside = await rig.said(http, "bob", session, f"afterwards write {rig.root / 'secret.txt'} overwritten")
        await held(rig, "coder", session, 2)
        outside = await rig.said(http, "bob", session, "echo now")
    assert inside == ["read hello from the notes\nsecond line\n"]
    # Outside Bob's path rule: refused naming the rule, as in a turn, and the file is as it was.
    assert outside[0].startswith("error -32602") and "path_under" in outside[0] and outside[1:] == ["now"]
    assert (rig.root / "secret.txt").read_text() == "not for agents"
    await eventually(lambda: len(bobs_reads()) == before + 2, what="the read between turns audited")
    decision, outcome = bobs_reads()[before:]
    assert (decision["event"], decision["decision"], outcome["event"], outcome["status"]) == \
        ("decision", "allow", "outcome", "ok")


async def test_between_turns_a_terminal_is_made_only_where_terminals_are_the_session_s(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        kept = await new_session(rig, http, "alice", "keeper")
        command = "sh -c echo${IFS}later;sleep${IFS}30"
        await rig.turn_on(http, "alice", "keeper", kept, f"afterwards background {command}")
        await held(rig, "keeper", kept, 1)
        made = await rig.said(http, "alice", kept, "peek term-1", "keeper")
        released = await rig.said(http, "alice", kept, "release term-1", "keeper")
        # A turn's terminal ends with its turn: between turns there is none to end it with.
        turns = await new_session(rig, http, "alice", "runner")
        await rig.turn_on(http, "alice", "runner", turns, "afterwards terminal echo hi")
        await held(rig, "runner", turns, 1)
        refused = await rig.said(http, "alice", turns, "echo now", "runner")
    assert made == ["made term-1", "output 'later\\n' exit running"] and released == ["released"]
    assert refused[0].startswith("error -32601") and "terminal_lifetime" in refused[0] and refused[1:] == ["now"]


async def test_a_request_waiting_between_turns_ends_with_its_session(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        await rig.turn(http, "alice", session, "afterwards permission")
        [pending] = await pending_approvals(rig.root)
        closed = await rig.call(http, "alice", "coder.session/close", {"sessionId": session})
        await held(rig, "coder", session, 1)
        code, out, err = await gatewayctl(rig.root, "approvals", "--json")
        await rig.call(http, "alice", "coder.session/resume",
                       {"sessionId": session, "cwd": str(rig.root), "mcpServers": []})
        told = await rig.said(http, "alice", session, "echo now")
    assert closed["result"] == {} and code == 0 and pending["id"] not in out, err
    assert told[0].startswith("error -32000") and "the session ended" in told[0] and told[1:] == ["now"]


async def kept_command(rig: Rig, http: aiohttp.ClientSession, name: str) -> tuple[str, int]:
    """A new session of `keeper` whose agent started a command in a terminal the session keeps: the session, and
    the command's pid."""
    session = await new_session(rig, http, "alice", "keeper")
    await rig.said(http, "alice", session, background(rig.root / f"{name}.pid"), "keeper")
    return session, await started(rig.root / f"{name}.pid")


async def test_a_session_s_terminal_ends_with_its_agent(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session, pid = await kept_command(rig, http, "restarted")
        code, _, err = await gatewayctl(rig.root, "restart", "keeper")
        assert code == 0, err
        await eventually(lambda: process_gone(pid), what="the terminal ends with the agent that kept it")
        await eventually(lambda: process_gone(int(session.rsplit("-", 1)[1])), what="the agent exits")


async def test_a_client_lists_configures_closes_and_resumes_only_its_own_sessions(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        mine = await new_session(rig, http, "alice", "pool")
        theirs = await new_session(rig, http, "bob", "pool")
        listed = await rig.call(http, "alice", "pool.session/list", {})
        bobs = await rig.call(http, "bob", "pool.session/list", {})
        # Bob's sessions are not Alice's to see, close, resume, configure or delete: they do not exist for her.
        refused = [await rig.call(http, "alice", f"pool.session/{method}", params) for method, params in (
            ("close", {"sessionId": theirs}), ("delete", {"sessionId": theirs}),
            ("resume", {"sessionId": theirs, "cwd": str(rig.root), "mcpServers": []}),
            ("set_config_option", {"sessionId": theirs, "configId": "speed", "value": "fast"}))]
        configured = await rig.call(http, "alice", "pool.session/set_config_option",
                                    {"sessionId": mine, "configId": "speed", "value": "fast"})
        first = await rig.said(http, "alice", mine, "count", "pool")
        closed = await rig.call(http, "alice", "pool.session/close", {"sessionId": mine})
        after_close = await rig.turn_on(http, "alice", "pool", mine, "count")
        resumed = await rig.call(http, "alice", "pool.session/resume",
                                 {"sessionId": mine, "cwd": str(rig.root), "mcpServers": []})
        again = await rig.said(http, "alice", mine, "count", "pool")
        # The agent itself has no session/delete: the caller hears its own answer, and the session stays hers.
        deleted = await rig.call(http, "alice", "pool.session/delete", {"sessionId": mine})
        still = await rig.said(http, "alice", mine, "count", "pool")
    listed_ids = [entry["sessionId"] for entry in listed["result"]["sessions"]]
    assert mine in listed_ids and theirs not in listed_ids  # (her sessions of earlier tests are there too)
    assert theirs in [entry["sessionId"] for entry in bobs["result"]["sessions"]]
    assert not set(listed_ids) & {entry["sessionId"] for entry in bobs["result"]["sessions"]}
    assert [answer["error"]["code"] for answer in refused] == [-32602] * 4
    assert all("unknown session" in answer["error"]["message"] for answer in refused)
    assert "result" in configured and first == ["1 fast"]
    assert closed["result"] == {} and after_close["error"]["code"] == -32602
    assert "result" in resumed and again == ["2 fast"]  # its conversation taken up again, without a replay
    assert deleted["error"]["code"] == -32601 and still == ["3 fast"]


async def test_closing_a_session_ends_the_terminals_it_kept(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session, pid = await kept_command(rig, http, "closed")
        closed = await rig.call(http, "alice", "keeper.session/close", {"sessionId": session})
        await eventually(lambda: process_gone(pid), what="the closed session's terminal ends")
    assert closed["result"] == {}


async def test_an_agent_that_exits_mid_turn_fails_the_turn_at_once(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "bob")
        failed = await rig.turn(http, "bob", session, "exit")
        fresh = await new_session(rig, http, "bob")
        again = await rig.said(http, "bob", fresh, "echo back")
    assert failed["error"]["code"] == -32011 and failed["error"]["data"]["exit_status"] == 3
    # Bob's own agent: its last words are his to see (a shared child's stay in the daemon's log).
    assert "agent: exiting in the middle of a turn, as told" in failed["error"]["data"]["stderr_tail"]
    assert again == ["back"]


async def test_what_an_agent_says_between_turns_comes_at_the_start_of_the_next(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "bob", "pool")
        quiet = await rig.turn_on(http, "bob", "pool", session, "later said between turns")
        await rig.daemon.wait_log(rf"server=pool session {session[:16]}… agent_message_chunk between turns: held")
        then = await rig.said(http, "bob", session, "echo now", "pool")
    assert quiet["result"] == {"stopReason": "end_turn"} and then == ["said between turns", "now"]


async def test_past_its_bound_the_oldest_update_between_turns_is_dropped(rig: Rig) -> None:
    spoken = MAX_HELD_UPDATES + 6
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "bob", "pool")
        await rig.turn_on(http, "bob", "pool", session, f"later-count {spoken}")

        def held() -> int:
            return sum(f"session {session[:16]}… agent_message_chunk between turns: held" in line
                       for line in rig.daemon.logs)

        await eventually(lambda: held() == spoken, what="every update between turns arrived")
        then = await rig.said(http, "bob", session, "echo now", "pool")
    assert then == [str(number) for number in range(6, spoken)] + ["now"]


async def test_a_flood_of_updates_still_ends_with_the_turn_s_result(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        session = await new_session(rig, http, "alice")
        said = await rig.said(http, "alice", session, "flood 3000")
    assert 0 < len(said) <= 3000 and set(said) == {"x"}


@asynccontextmanager
async def mcp_client(rig: Rig, client: str, **callbacks: Any) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.tokens[client])},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        async with Client(streamable_http_client(rig.url, http_client=http), mode="legacy",
                          read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as sdk:
            yield sdk


async def yes(_context: Any, _params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"approve": True})


async def test_an_mcp_client_drives_its_session_s_agent_with_the_prompt_tool(rig: Rig) -> None:
    async with mcp_client(rig, "alice", elicitation_callback=yes) as sdk:
        listed = {tool.name for tool in (await sdk.list_tools()).tools}
        first = await sdk.call_tool("mate__prompt", {"text": "echo hello agent"})
        session = first.structured_content["sessionId"]
        counted = await sdk.call_tool("mate__prompt", {"text": "count", "sessionId": session})
        asked = await sdk.call_tool("mate__prompt", {"text": "permission", "sessionId": session})
        pid = int((await sdk.call_tool("mate__prompt", {"text": "pid", "sessionId": session})).content[0].text)
    assert "mate__prompt" in listed
    assert first.content[0].text == "hello agent" and first.structured_content["stopReason"] == "end_turn"
    assert counted.content[0].text == "2" and asked.content[0].text == "chose yes"
    # The MCP session ended with the client: its agent stops.
    await eventually(lambda: process_gone(pid), what="the ended session's agent exits")


async def test_between_turns_a_permission_is_put_to_the_user_of_the_last_turn_s_mcp_session(rig: Rig) -> None:
    async with mcp_client(rig, "alice", elicitation_callback=yes) as sdk:
        first = await sdk.call_tool("mate__prompt", {"text": "afterwards permission"})
        session = first.structured_content["sessionId"]
        # Asked on the session's own stream, its user answers (the SDK client's elicitation callback): yes.
        await held(rig, "mate", session, 1)
        then = await sdk.call_tool("mate__prompt", {"text": "echo now", "sessionId": session})
    assert first.content[0].text == "" and then.content[0].text == "chose yesnow"

    def decided() -> list[dict[str, Any]]:
        return audited(rig, event="approval_decided", method="mate.session/request_permission")

    await eventually(lambda: bool(decided()), what="the permission's decision audited")
    assert decided()[-1]["channel"] == "client" and decided()[-1]["state"] == "approved"


async def test_what_an_agent_says_between_turns_is_told_to_the_last_turn_s_mcp_session_as_it_comes(rig: Rig) -> None:
    heard: list[Any] = []

    async def log(params: Any) -> None:
        heard.append(params)

    async with mcp_client(rig, "alice", logging_callback=log) as sdk:
        first = await sdk.call_tool("mate__prompt", {"text": "afterwards echo done in the background"})
        session = first.structured_content["sessionId"]
        await eventually(lambda: any(params.data["content"]["text"] == "done in the background" for params in heard),
                         what="the agent's words between turns heard on the session's stream")
        then = await sdk.call_tool("mate__prompt", {"text": "echo now", "sessionId": session})
    # Heard once, as it came; its words are the next turn's result's too (the model reads it there), not told again.
    [told] = [params for params in heard if params.data["content"]["text"] == "done in the background"]
    assert (told.level, told.logger, told.data["sessionUpdate"]) == ("info", "mate", "agent_message_chunk")
    assert then.content[0].text == "done in the backgroundnow"
    assert [params.data["content"]["text"] for params in heard][-1] == "now"


async def test_no_agent_outlives_the_daemon(tmp_path: Path) -> None:
    agent = python_command(str(AGENT)) + '\nprotocol = "acp"\nisolation = "client"\n'
    tokens = write_config(tmp_path, {"coder": agent},
                          '[roles.dev]\nallow = ["coder.session/*"]\n', {"alice": ["dev"]})
    async with Daemon(tmp_path) as running, aiohttp.ClientSession() as http:
        answer = await rpc(http, running.url, tokens["alice"], "coder.session/new", {"cwd": str(tmp_path),
                                                                                     "mcpServers": []})
        session = answer["result"]["sessionId"]
        turn = await rpc(http, running.url, tokens["alice"], "coder.session/prompt",
                         {"sessionId": session, "prompt": [{"type": "text", "text": "pid"}]})
        assert turn["result"]["stopReason"] == "end_turn"
        pid = int(session.rsplit("-", 1)[1])
    assert process_gone(pid)


async def test_a_client_that_opens_sessions_until_the_limit_is_told_so(rig: Rig) -> None:
    # `mate` runs an agent per MCP session, at most 4 of one client's at once (max_children_per_client).
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(4):
            sdk = await stack.enter_async_context(mcp_client(rig, "bob"))
            assert (await sdk.call_tool("mate__prompt", {"text": "echo here"})).content[0].text == "here"
        fifth = await stack.enter_async_context(mcp_client(rig, "bob"))
        with pytest.raises(MCPError) as refused:
            await fifth.call_tool("mate__prompt", {"text": "echo here"})
    assert refused.value.error.code == -32014 and "max_children_per_client" in refused.value.error.message


async def test_discovery_lists_an_agent_s_session_methods_and_its_prompt_tool_answers_directly(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        document = (await rig.call(http, "alice", "rpc.discover", None))["result"]
        direct = await rig.call(http, "alice", "coder.prompt", {"text": "echo direct"})
    names = {method["name"] for method in document["methods"]}
    assert {"coder.session/new", "coder.session/prompt", "coder.session/cancel", "coder.prompt"} <= names
    # What the client may not call is not there: pool's prompt tool is not granted to the dev role.
    assert "pool.prompt" not in names and "pool.session/new" in names
    assert direct["result"]["content"][0]["text"] == "direct"
