"""One client cannot hurt the others: bounded memory, a per-client share of every shared pool, honest approvals.

In-process on real sockets, with real children. Each test crosses one limit as a hostile client would and shows
that the limit holds and that another client is still served.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd import approvals, jsonrpc, sessions
from gatewayd.routing import MAX_NAME_CHARS
from gatewayd.state import DaemonState
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import POLL_INTERVAL, eventually

SPY = """
protocol = "jsonrpc"
max_in_flight = 4
max_queued = 4
call_timeout = "20s"
[methods.echo]
[methods.sleep]
[methods.huge]
"""
GATED = """
protocol = "jsonrpc"
[methods.echo]
confirm = true
"""
ROLES = """
[roles.agent]
allow = ["spy.*", "gated.*"]
[roles.mal]
allow = ["spy.*", "gated.*"]
"""
CLIENTS = {"mallory": ["mal"], "alice": ["agent"], "hoarder": ["agent"]}
HOARDER_CONCURRENT = 2
# An answer larger than the loopback socket buffers can hold, so a client that does not read it leaves it unsent.
UNREAD_ANSWER_BYTES = 12 * 1024 * 1024


class Shares:
    def __init__(self, client: LocalClient, state: DaemonState, tokens: dict[str, str], record: Path) -> None:
        self.client = client
        self.state = state
        self.tokens = tokens
        self.record = record

    async def post(self, body: Any, who: str = "alice", **extra: str) -> tuple[int, Any]:
        response = await self.client.post("/mcp", data=json.dumps(body), headers=headers(self.tokens[who], **extra))
        text = await response.text()
        return response.status, json.loads(text) if response.content_type == "application/json" else text

    async def call(self, method: str, params: Any, who: str = "alice", id: Any = 1) -> dict[str, Any]:
        status, body = await self.post({"jsonrpc": "2.0", "id": id, "method": method, "params": params}, who)
        assert status == 200, body
        answer: dict[str, Any] = body
        return answer

    def received(self, method: str) -> list[Any]:
        lines = self.record.read_text().split("\n")[:-1] if self.record.exists() else []
        return [m.get("params") for m in map(json.loads, filter(None, lines)) if m.get("method") == method]


@pytest.fixture
async def shares(tmp_path: Path) -> AsyncIterator[Shares]:
    record = tmp_path / "received.jsonl"
    child = python_command(str(FAULTSRV), "--record", str(record))
    tokens = write_config(tmp_path, {"spy": child + SPY, "gated": child + GATED}, ROLES, CLIENTS)
    with (tmp_path / "policies" / "clients.toml").open("a") as clients:
        clients.write(f"\n[clients.hoarder.limits]\nmax_concurrent = {HOARDER_CONCURRENT}\n")
    async with running_stack(tmp_path, client_max_concurrent=1000, client_rate=1e6, client_burst=10**6,
                             max_sessions_per_client=3) as (client, state):
        yield Shares(client, state, tokens, record)


async def test_a_gated_call_sends_exactly_what_was_approved(shares: Shares) -> None:
    call = asyncio.ensure_future(shares.call("gated.echo", {"x": 1, "_meta": {"cmd": "rm -rf /"}}))
    await eventually(lambda: len(shares.state.approvals) == 1, what="the call waits for a person")
    [approval] = shares.state.approvals.pending()
    assert approval.arguments == {"x": 1}
    shares.state.approvals.decide(approval.id, approve=True, by="test", channel=approvals.CLI)
    assert "result" in await call
    assert shares.received("echo") == [{"x": 1}]


async def test_a_direct_call_with_progress_sends_only_the_gateways_own_meta(shares: Shares) -> None:
    answer = await shares.call("spy.echo", {"y": 2, "_meta": {"progressToken": "t", "cmd": "x"}})
    assert answer["result"] == {"y": 2}
    [sent] = shares.received("echo")
    assert sent == {"y": 2}


async def test_initialize_keeps_a_bounded_part_of_what_it_was_sent(shares: Shares) -> None:
    capabilities = {f"k{i}": {"nested": {"deeper": {"deepest": "x" * 1000}}, "list": list(range(100))}
                    for i in range(2_000)}
    capabilities["elicitation"] = {"form": {}}
    status, _ = await shares.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities,
        "clientInfo": {"name": "n" * 100_000, "version": "1"}}})
    assert status == 200
    [session] = shares.state.sessions.all()
    kept = json.dumps({"c": session.capabilities, "i": session.client_info})
    assert len(kept) < sessions.KEPT_KEYS * sessions.KEPT_STRING * 4
    assert len(session.client_info["name"]) == sessions.KEPT_STRING


async def test_a_client_holds_only_its_share_of_sessions(shares: Shares) -> None:
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "m"}}}
    for _ in range(3):
        assert (await shares.post(body, "mallory"))[0] == 200
    status, text = await shares.post(body, "mallory")
    assert status == 429 and "3 MCP sessions" in text
    assert (await shares.post(body, "alice"))[0] == 200


async def test_huge_method_names_are_unknown_and_leave_nothing_behind(shares: Shares) -> None:
    principal = shares.state.principal("mallory")
    assert principal is not None
    for i in range(20):
        name = f"spy.{i}" + "x" * (jsonrpc.MAX_METHOD_CHARS - 10)
        answer = await shares.call(name, {}, "mallory")
        assert answer["error"]["code"] == -32601
    assert all(len(target) <= MAX_NAME_CHARS for target, _ in principal._decisions)
    status, refused = await shares.post({"jsonrpc": "2.0", "id": "i" * 100_000, "method": "spy." + "x" * 100_000},
                                        "mallory")
    assert status == 200 and refused["error"]["code"] == -32600 and refused["id"] is None
    assert shares.received("echo") == []


async def test_a_gated_call_with_more_arguments_than_a_person_can_review_is_refused(shares: Shares) -> None:
    answer = await shares.call("gated.echo", {"blob": "x" * (approvals.MAX_ARGUMENT_BYTES + 1)})
    assert answer["error"]["code"] == -32602 and answer["error"]["data"]["limit"] == approvals.MAX_ARGUMENT_BYTES
    assert len(shares.state.approvals) == 0


async def test_a_client_holds_only_its_share_of_pending_approvals(shares: Shares) -> None:
    shares.state.approvals.max_per_client = 2
    waiting = [asyncio.ensure_future(shares.call("gated.echo", {"n": n}, "mallory", id=n)) for n in range(2)]
    await eventually(lambda: len(shares.state.approvals) == 2, what="mallory's calls wait")
    third = await shares.call("gated.echo", {"n": 3}, "mallory")
    assert third["error"]["code"] == -32014
    theirs = asyncio.ensure_future(shares.call("gated.echo", {"n": "alice"}))
    await eventually(lambda: len(shares.state.approvals) == 3, what="alice's call waits too")
    for approval in shares.state.approvals.pending():
        shares.state.approvals.decide(approval.id, approve=False, by="test", channel=approvals.CLI)
    assert all("error" in answer for answer in await asyncio.gather(*waiting, theirs))


async def test_a_client_that_fills_a_servers_slots_and_queue_leaves_room_for_others(shares: Shares) -> None:
    # max_in_flight 4 → mallory may hold 3 slots; max_queued 4 → 2 places in the queue.
    slow = [asyncio.ensure_future(shares.call("spy.sleep", {"seconds": 5}, "mallory", id=n)) for n in range(5)]
    await eventually(lambda: len(shares.received("sleep")) == 3, what="mallory's share of the slots is taken")
    refused = await shares.call("spy.sleep", {"seconds": 5}, "mallory", id=9)
    assert refused["error"]["code"] == -32014
    answer = await asyncio.wait_for(shares.call("spy.echo", {"alice": True}), 3)
    assert answer["result"] == {"alice": True}
    for task in slow:
        task.cancel()


async def test_numbers_json_cannot_carry_are_parse_errors_at_the_door(shares: Shares) -> None:
    response = await shares.client.post("/mcp", data=b'{"jsonrpc":"2.0","id":1,"method":"spy.echo","params":[1e400]}',
                                        headers=headers(shares.tokens["alice"]))
    assert response.status == 400 and (await response.json())["error"]["code"] == -32700
    assert shares.received("echo") == []


async def test_a_call_whose_permission_a_reload_removed_while_it_waited_does_not_run(shares: Shares,
                                                                                    tmp_path: Path) -> None:
    # Alice fills the server so the next call waits for a slot; mallory's call waits behind them.
    for n in range(3):
        asyncio.ensure_future(shares.call("spy.sleep", {"seconds": 1}, "alice", id=n))
    fourth = asyncio.ensure_future(shares.call("spy.sleep", {"seconds": 1}, "mallory", id=3))
    await eventually(lambda: len(shares.received("sleep")) == 4, what="the server is full")
    waiting = asyncio.ensure_future(shares.call("spy.echo", {"late": True}, "mallory", id=4))
    await eventually(lambda: shares.state.generation.servers["spy"].status()["waiting"] == 1,
                     what="mallory's call waits for a slot")
    (tmp_path / "policies" / "roles.toml").write_text(ROLES.replace('[roles.mal]\nallow = ["spy.*", "gated.*"]',
                                                                    '[roles.mal]\nallow = ["gated.*"]'))
    result = await _reload(shares)
    assert result["ok"] and result["roles"]["changed"] == ["mal"], result
    answer = await asyncio.wait_for(waiting, 10)
    assert answer["error"]["code"] == -32601
    assert await fourth
    assert shares.received("echo") == []


async def _reload(shares: Shares) -> dict[str, Any]:
    from gatewayd.admin import AdminClient

    path = shares.state.settings.admin_socket_path()
    assert path is not None
    status, body = await AdminClient(path).call("POST", "/reload")
    assert status == 200, body
    reloaded: dict[str, Any] = body
    return reloaded


async def test_answers_a_client_does_not_read_keep_holding_its_slots(shares: Shares) -> None:
    unread = []
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "spy.huge", "params": {"size": UNREAD_ANSWER_BYTES}})
    for _ in range(HOARDER_CONCURRENT):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", shares.client.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write((f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{shares.client.port}\r\n"
                      f"Authorization: Bearer {shares.tokens['hoarder']}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(payload)}\r\n\r\n{payload}").encode())
        unread.append(writer)
    await eventually(lambda: len(shares.received("huge")) == HOARDER_CONCURRENT and not shares.state.inflight,
                     what="both answers are being written to clients that do not read them")
    status, _ = await shares.post({"jsonrpc": "2.0", "id": 2, "method": "spy.echo", "params": {}}, "hoarder")
    assert status == 429
    assert (await shares.call("spy.echo", {"alice": 1}))["result"] == {"alice": 1}
    for writer in unread:
        writer.close()
    # The slots come back once the server sees the connections closed: poll, with a deadline.
    for _ in range(int(10 / POLL_INTERVAL)):
        status, _ = await shares.post({"jsonrpc": "2.0", "id": 3, "method": "spy.echo", "params": {}}, "hoarder")
        if status == 200:
            break
        await asyncio.sleep(POLL_INTERVAL)
    assert status == 200


async def test_a_client_is_charged_for_its_bytes_and_others_are_not(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + SPY}, ROLES, CLIENTS)
    with (tmp_path / "policies" / "clients.toml").open("a") as clients:
        clients.write("\n[clients.hoarder.limits]\nrate = 100000.0\nburst = 100000\n")
    async with running_stack(tmp_path, max_body_bytes=64 * 1024, client_bytes_rate=1024, client_bytes_burst=64 * 1024,
                             client_rate=1.0, client_burst=4) as (client, state):
        shares = Shares(client, state, tokens, tmp_path / "none")
        big = {"jsonrpc": "2.0", "id": 1, "method": "spy.echo", "params": {"blob": "x" * 60_000}}
        assert (await shares.post(big, "mallory"))[0] == 200
        response = await client.post("/mcp", data=json.dumps(big), headers=headers(tokens["mallory"]))
        assert response.status == 429 and int(response.headers["Retry-After"]) >= 1
        assert "bytes/s" in await response.text()
        assert (await shares.post(big, "alice"))[0] == 200
        # A client whose message rate was lifted gets 4 KiB of bytes per message with it.
        for _ in range(3):
            assert (await shares.post(big, "hoarder"))[0] == 200
