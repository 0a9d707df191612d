"""The official MCP SDK (`mcp` 2.3.0) answering the gateway's approval question itself (MCP elicitation).

Against the real daemon serving the shipped `shell.run` (confirm-gated) to clients with the shipped
`developer` role, an SDK client with an `elicitation_callback` is asked exactly once, during its call,
for a yes/no form naming the client, `shell.run` and the arguments, and is told by an `approval_pending`
notice (same approval id) that the call waits. Accept with approve=true runs the command and returns
its output; decline, cancel and accept with approve=false are refused as -32015 with the approval id
and the reason, and the command never runs (it would have created a file); nobody answering before the
policy's timeout is -32016, and a yes that arrives after it is taken (202) but runs nothing. An SDK
client without the callback is never asked: its call waits for an operator, and the real
`gatewayctl approve` lets it run.

One daemon serves the whole module: every test uses its own marker file and its own approval.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CallToolResult,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
)

from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token
from tests.daemon import REPO, Daemon, gatewayctl, pending_approvals
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, TEST_DEADLINE, bearer, sdk_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOL: Final = "shell__run"
CONFIRM_DENIED: Final = -32015
CONFIRM_EXPIRED: Final = -32016
# Whoever answers by elicitation is recorded as this (gatewayd/gateway.py `_elicit`).
ELICITED_BY: Final = "the user of client {client} (elicitation)"
# A second policy file: the `quick` role grants shell.run like the shipped `developer` does, but its own
# confirmation settings (which win for the role that grants the call) give a person one second to answer.
QUICK_TIMEOUT_S: Final = 1
QUICK_ROLE: Final = f"""
[roles.quick]
confirm = ["shell.run"]

[roles.quick.confirmation."shell.run"]
timeout = "{QUICK_TIMEOUT_S}s"
channels = ["client"]
"""
APPROVAL_IN_MESSAGE: Final = re.compile(r"\(approval ([0-9a-f]+)\)$")


@dataclass
class Gateway:
    daemon: Daemon
    laptop: str  # token of client `laptop`: the shipped `developer` role
    hasty: str  # token of client `hasty`: only `quick` (a one-second confirmation timeout)

    @property
    def url(self) -> str:
        return self.daemon.url


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    root = tmp_path_factory.mktemp("elicitation")
    (root / "tools.d").mkdir()
    (root / "policies").mkdir()
    shutil.copy(REPO / "tools.d" / "shell.toml", root / "tools.d" / "shell.toml")
    shutil.copy(REPO / "policies" / "roles.toml", root / "policies" / "roles.toml")
    (root / "policies" / "quick.toml").write_text(QUICK_ROLE)
    tokens = {"laptop": new_token(), "hasty": new_token()}
    clients = root / "policies" / "clients.toml"
    set_client_token(clients, "laptop", hash_token(tokens["laptop"]), ["developer"])
    set_client_token(clients, "hasty", hash_token(tokens["hasty"]), ["quick"])
    async with Daemon(root) as daemon:
        yield Gateway(daemon, tokens["laptop"], tokens["hasty"])


# -- the client's user, and what the client hears ----------------------------------------------


@dataclass
class User:
    """The person behind the SDK client: answers every elicitation with `answer`; if `away`, only after `back()`.

    Callbacks only record (the SDK would turn an exception in one into an error answer); tests assert afterwards.
    """

    answer: ElicitResult
    away: bool = False
    asked: list[ElicitRequestParams] = field(default_factory=list)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the SDK cancels the question (the gateway withdrew it with notifications/cancelled).
    withdrawn: asyncio.Event = field(default_factory=asyncio.Event)
    _present: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if not self.away:
            self._present.set()

    def back(self) -> None:
        self._present.set()

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        self.asked.append(params)
        try:
            await self._present.wait()
        except asyncio.CancelledError:
            self.withdrawn.set()
            raise
        self.answered.set()
        return self.answer

    @property
    def question(self) -> ElicitRequestFormParams:
        """The one question asked, a form (the test fails if there were more or none)."""
        assert len(self.asked) == 1, self.asked
        question = self.asked[0]
        assert isinstance(question, ElicitRequestFormParams), question
        return question

    @property
    def approval_id(self) -> str:
        """The approval the question is about, as its message names it."""
        match = APPROVAL_IN_MESSAGE.search(self.question.message)
        assert match is not None, self.question.message
        return match.group(1)


@dataclass
class Notices:
    """The gateway's `gatewayd.approvals` log notifications to this client."""

    received: list[LoggingMessageNotificationParams] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, LoggingMessageNotification) and message.params.logger == "gatewayd.approvals":
            self.received.append(message.params)
            self.arrived.set()

    async def pending(self) -> dict[str, Any]:
        """The one `approval_pending` notice's data (waited for: the SDK handles notifications in tasks)."""
        await self.arrived.wait()
        assert len(self.received) == 1, self.received
        [notice] = self.received
        assert notice.level == "notice", notice
        assert isinstance(notice.data, dict) and notice.data["event"] == "approval_pending", notice
        return notice.data


@asynccontextmanager
async def elicited_client(
    url: str, token: str, user: User, notices: Notices, posted: list[dict[str, Any]] | None = None
) -> AsyncIterator[Client]:
    """An SDK client that declares elicitation (any `elicitation_callback` makes it do so), answered by `user`.

    Every JSON-RPC response the client POSTs (its answers to the gateway's requests) is appended to `posted`
    once the gateway has answered that POST, with the HTTP status as `"status"`.
    """

    async def record(response: httpx2.Response) -> None:
        request = response.request
        if posted is None or request.method != "POST":
            return
        message = json.loads(request.content)
        if isinstance(message, dict) and "method" not in message:
            posted.append({**message, "status": response.status_code})

    async with httpx2.AsyncClient(
        headers={"Authorization": bearer(token)}, timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT),
        event_hooks={"response": [record]},
    ) as http:
        async with Client(
            streamable_http_client(url, http_client=http), mode="legacy", read_timeout_seconds=SDK_READ_TIMEOUT,
            elicitation_callback=user, message_handler=notices,
        ) as client:
            yield client


def run_args(marker: Path, echo: str) -> dict[str, Any]:
    """shell.run arguments whose command leaves `marker` behind if it ever runs, then prints `echo`."""
    return {"command": f"touch {marker} && echo {echo}"}


def assert_asked_about(user: User, client: str, arguments: dict[str, Any]) -> None:
    """The one question names the client, shell.run and the exact arguments, and asks for a yes/no `approve`."""
    question = user.question
    assert question.mode == "form"
    assert f"{client} wants to run shell.run with arguments {json.dumps(arguments)}." in question.message
    schema = question.requested_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["approve"]
    assert schema["properties"]["approve"]["type"] == "boolean"


# -- the caller's own user decides -------------------------------------------------------------


async def test_accepting_with_approve_true_runs_the_command(gateway: Gateway, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    arguments = run_args(marker, "approved-by-user")
    user = User(ElicitResult(action="accept", content={"approve": True}))
    notices = Notices()
    async with asyncio.timeout(TEST_DEADLINE), elicited_client(gateway.url, gateway.laptop, user, notices) as client:
        result = await client.call_tool(TOOL, arguments)
        notice = await notices.pending()
    assert isinstance(result, CallToolResult)
    assert result.is_error is False
    assert result.structured_content == {"exit_code": 0, "output": "approved-by-user\n"}
    assert marker.exists()
    assert_asked_about(user, "laptop", arguments)
    # The notice is about the same approval, and says how an operator could have approved it instead.
    assert notice["approval_id"] == user.approval_id
    assert (notice["method"], notice["approve_with"]) == ("shell.run", f"gatewayctl approve {user.approval_id}")
    decided = await gateway.daemon.wait_log(rf"approval {user.approval_id} approved")
    assert ELICITED_BY.format(client="laptop") in decided


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ElicitResult(action="decline"), "the client's user chose decline"),
        (ElicitResult(action="accept", content={"approve": False}), "the client's user did not say yes"),
        (ElicitResult(action="cancel"), "the client's user chose cancel"),
    ],
    ids=["decline", "accept-with-approve-false", "cancel"],
)
async def test_anything_but_a_yes_denies_and_the_command_never_runs(
    gateway: Gateway, tmp_path: Path, answer: ElicitResult, reason: str
) -> None:
    marker = tmp_path / "ran"
    arguments = run_args(marker, "never")
    user = User(answer)
    notices = Notices()
    async with asyncio.timeout(TEST_DEADLINE), elicited_client(gateway.url, gateway.laptop, user, notices) as client:
        with pytest.raises(MCPError) as denied:
            await client.call_tool(TOOL, arguments)
        notice = await notices.pending()
    assert denied.value.code == CONFIRM_DENIED, denied.value
    assert denied.value.message == "shell.run: the confirmation was denied"
    assert denied.value.data == {
        "approval_id": user.approval_id, "reason": reason, "decided_by": ELICITED_BY.format(client="laptop"),
        "error_type": "confirmation_denied", "retryable": False,
    }
    assert notice["approval_id"] == user.approval_id
    assert_asked_about(user, "laptop", arguments)
    assert not marker.exists()


async def test_no_answer_before_the_timeout_expires_and_the_question_is_withdrawn(
    gateway: Gateway, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    arguments = run_args(marker, "too-late")
    user = User(ElicitResult(action="accept", content={"approve": True}), away=True)  # until after the deadline
    notices = Notices()
    posted: list[dict[str, Any]] = []
    async with (
        asyncio.timeout(TEST_DEADLINE),
        elicited_client(gateway.url, gateway.hasty, user, notices, posted) as client,
    ):
        with pytest.raises(MCPError) as expired:
            await client.call_tool(TOOL, arguments)
        notice = await notices.pending()
        # The gateway withdrew its question (notifications/cancelled): the SDK stops asking the user.
        await user.withdrawn.wait()
        assert not user.answered.is_set() and posted == []
        code, out, err = await gatewayctl(gateway.daemon.config_dir, "approvals", "--json")
    assert expired.value.code == CONFIRM_EXPIRED, expired.value
    assert expired.value.data == {
        "approval_id": user.approval_id, "reason": f"no answer within {QUICK_TIMEOUT_S}s", "decided_by": None,
        "error_type": "confirmation_expired", "retryable": True,
    }
    assert notice["approval_id"] == user.approval_id
    assert_asked_about(user, "hasty", arguments)
    assert code == 0 and json.loads(out) == [], (out, err)  # nothing left waiting for anyone
    assert not marker.exists()


# -- a client that cannot be asked -------------------------------------------------------------


async def test_without_an_elicitation_callback_an_operator_approves(gateway: Gateway, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    arguments = run_args(marker, "approved-by-operator")
    notices = Notices()
    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_client(gateway.url, bearer(gateway.laptop), message_handler=notices) as client,
    ):
        call = asyncio.ensure_future(client.call_tool(TOOL, arguments))
        [pending] = await pending_approvals(gateway.daemon.config_dir, timeout=TEST_DEADLINE)
        # Not asked: only operators may answer (the client channel is dropped for a session that cannot elicit).
        assert (pending["client"], pending["method"], pending["arguments"]) == ("laptop", "shell.run", arguments)
        assert "client" not in pending["channels"] and "gatewayctl" in pending["channels"], pending
        notice = await notices.pending()
        assert notice["approval_id"] == pending["id"]
        assert not call.done() and not marker.exists()  # the call waits, nothing has run
        code, out, err = await gatewayctl(gateway.daemon.config_dir, "approve", pending["id"])
        assert code == 0 and "approved" in out, err
        result = await call
    # Had the gateway elicited anyway, the SDK's default answer (an error) would have denied the call.
    assert result.is_error is False
    assert result.structured_content == {"exit_code": 0, "output": "approved-by-operator\n"}
    assert marker.exists()
